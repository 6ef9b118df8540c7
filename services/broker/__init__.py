"""The pub/sub broker of one node: its parts (routes, dispatch, delivery,
subscriptions, the connection manager, wills, the remote side), wired by
`broker.Broker`."""
