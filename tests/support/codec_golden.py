"""Golden bytes for every control packet at every level, written by hand from the spec.

Each case is (level, bytes, packet): decoding the bytes gives the packet and
uses all of them, and encoding the packet at that level gives the bytes.
Checked both ways in tests/mqtt/test_codec_golden.py; the round-trip tests
also start from these packets. `h()` reads the hex notation, `|` as a space.
"""

from __future__ import annotations

from services.mqtt.packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
)


def h(text: str) -> bytes:
    return bytes.fromhex(text.replace("|", " "))


MQTT = "00 04 4d 51 54 54"  # "MQTT"
MQISDP = "00 06 4d 51 49 73 64 70"  # "MQIsdp"

GOLDEN: list[tuple[int, bytes, Packet]] = [
    # CONNECT
    (3, h(f"10 10 {MQISDP} 03 02 00 3c | 00 02 63 31"),
     Connect("c1", 3, True, 60, protocol_name="MQIsdp")),
    (4, h(f"10 0e {MQTT} 04 02 00 3c | 00 02 63 31"), Connect("c1", 4, True, 60)),
    (4, h(f"10 0c {MQTT} 04 00 00 00 | 00 00"), Connect("", 4, False, 0)),
    # will QoS 1 + retain, user name, password: flags 1110 1110
    (4, h(f"10 19 {MQTT} 04 ee 00 3c | 00 01 63 | 00 01 77 | 00 01 78 | 00 01 75 | 00 01 70"),
     Connect("c", 4, True, 60, "u", b"p", Will("w", b"x", 1, True))),
    (3, h(f"10 1d {MQISDP} 03 ee 00 0a | 00 01 63 | 00 01 77 | 00 03 61 62 63 | 00 01 75 "
          "| 00 01 70"),
     Connect("c", 3, True, 10, "u", b"p", Will("w", b"abc", 1, True), protocol_name="MQIsdp")),
    (5, h(f"10 13 {MQTT} 05 02 00 3c | 05 11 00 00 00 0a | 00 01 63"),
     Connect("c", 5, True, 60, properties=Properties(session_expiry_interval=10))),
    (5, h(f"10 27 {MQTT} 05 ee 00 3c | 05 11 00 00 00 0a | 00 03 63 69 64 "
          "| 05 18 00 00 00 05 | 00 01 77 | 00 01 78 | 00 01 75 | 00 01 70"),
     Connect("cid", 5, True, 60, "u", b"p",
             Will("w", b"x", 1, True, Properties(will_delay_interval=5)),
             Properties(session_expiry_interval=10))),
    # 5.0 allows a password without a user name: flags 0100 0000
    (5, h(f"10 10 {MQTT} 05 40 00 00 | 00 | 00 01 63 | 00 00"),
     Connect("c", 5, False, 0, None, b"")),
    # CONNACK
    (3, h("20 02 00 05"), Connack(False, 5)),
    (4, h("20 02 01 00"), Connack(True, 0)),
    (4, h("20 02 00 04"), Connack(False, 4)),
    (5, h("20 03 00 00 00"), Connack(False, 0)),
    (5, h("20 08 01 00 05 21 00 0a 24 01"),
     Connack(True, 0, Properties(receive_maximum=10, maximum_qos=1))),
    (5, h("20 03 00 84 00"), Connack(False, 0x84)),
    # PUBLISH
    (3, h("30 07 00 03 61 2f 62 68 69"), Publish("a/b", b"hi")),
    (4, h("30 07 00 03 61 2f 62 68 69"), Publish("a/b", b"hi")),
    (4, h("3b 09 00 03 61 2f 62 00 0a 68 69"), Publish("a/b", b"hi", 1, True, True, 10)),
    (4, h("34 05 00 01 61 ff ff"), Publish("a", b"", 2, False, False, 0xFFFF)),
    (3, h("3d 05 00 01 61 00 01"), Publish("a", b"", 2, True, True, 1)),
    (5, h("30 08 00 03 61 2f 62 00 68 69"), Publish("a/b", b"hi")),
    (5, h("32 0a 00 00 00 01 03 23 00 01 68 69"),
     Publish("", b"hi", 1, False, False, 1, Properties(topic_alias=1))),
    (5, h("30 25 00 01 74 | 1f | 01 01 | 02 00 00 00 3c | 03 00 01 74 | 08 00 01 72 "
          "| 09 00 01 63 | 0b 01 | 0b c8 01 | 26 00 01 6b 00 01 76 | 68 69"),
     Publish("t", b"hi", properties=Properties(
         payload_format_indicator=1, message_expiry_interval=60, content_type="t",
         response_topic="r", correlation_data=b"c", subscription_identifier=(1, 200),
         user_property=(("k", "v"),)))),
    # PUBACK / PUBREC / PUBREL / PUBCOMP
    (4, h("40 02 00 0a"), Puback(10)),
    (3, h("50 02 00 0a"), Pubrec(10)),
    (4, h("62 02 00 0a"), Pubrel(10)),
    (4, h("70 02 00 0a"), Pubcomp(10)),
    (5, h("40 02 00 0a"), Puback(10)),
    (5, h("40 03 00 0a 10"), Puback(10, 0x10)),
    (5, h("40 08 00 0a 10 04 1f 00 01 78"), Puback(10, 0x10, Properties(reason_string="x"))),
    (5, h("50 03 01 00 80"), Pubrec(256, 0x80)),
    (5, h("62 03 00 0a 92"), Pubrel(10, 0x92)),
    (5, h("70 02 00 0a"), Pubcomp(10)),
    (5, h("70 0a 00 0a 00 06 26 00 01 61 00 00"),
     Pubcomp(10, 0, Properties(user_property=(("a", ""),)))),
    # SUBSCRIBE / SUBACK
    (4, h("82 0c 00 01 | 00 03 61 2f 23 01 | 00 01 62 00"),
     Subscribe(1, (Subscription("a/#", 1), Subscription("b", 0)))),
    (3, h("82 06 00 02 00 01 61 02"), Subscribe(2, (Subscription("a", 2),))),
    (5, h("82 09 00 01 | 02 0b 05 | 00 01 61 2e"),
     Subscribe(1, (Subscription("a", 2, True, True, 2),),
               Properties(subscription_identifier=(5,)))),
    (5, h("82 0a 00 01 00 | 00 01 61 00 | 00 00 10"),
     Subscribe(1, (Subscription("a"), Subscription("", 0, retain_handling=1)))),
    (4, h("90 04 00 01 01 80"), Suback(1, (1, 0x80))),
    (3, h("90 03 00 01 02"), Suback(1, (2,))),
    (5, h("90 05 00 01 00 02 87"), Suback(1, (2, 0x87))),
    # UNSUBSCRIBE / UNSUBACK
    (4, h("a2 05 00 02 00 01 61"), Unsubscribe(2, ("a",))),
    (5, h("a2 09 00 02 00 00 01 61 00 01 62"), Unsubscribe(2, ("a", "b"))),
    (3, h("b0 02 00 02"), Unsuback(2)),
    (4, h("b0 02 00 02"), Unsuback(2)),
    (5, h("b0 05 00 02 00 00 11"), Unsuback(2, (0, 0x11))),
    # the rest at the levels not shown above
    (3, h("40 02 00 0a"), Puback(10)),
    (4, h("50 02 00 0a"), Pubrec(10)),
    (3, h("62 02 00 0a"), Pubrel(10)),
    (3, h("70 02 00 0a"), Pubcomp(10)),
    (3, h("a2 05 00 02 00 01 61"), Unsubscribe(2, ("a",))),
    (3, h("c0 00"), Pingreq()),
    (3, h("d0 00"), Pingresp()),
    (3, h("e0 00"), Disconnect()),
    (4, h("d0 00"), Pingresp()),
    (5, h("c0 00"), Pingreq()),
    # PINGREQ / PINGRESP
    (4, h("c0 00"), Pingreq()),
    (5, h("d0 00"), Pingresp()),
    # DISCONNECT / AUTH
    (4, h("e0 00"), Disconnect()),
    (5, h("e0 00"), Disconnect()),
    (5, h("e0 01 04"), Disconnect(4)),
    (5, h("e0 07 8e 05 11 00 00 00 00"), Disconnect(0x8E, Properties(session_expiry_interval=0))),
    (5, h("f0 00"), Auth()),
    (5, h("f0 0a 18 08 15 00 01 6d 16 00 01 64"),
     Auth(0x18, Properties(authentication_method="m", authentication_data=b"d"))),
]
