"""The listeners: sockets (TCP, TLS, WebSocket), one MQTT connection each,
its channel driven over asyncio."""
