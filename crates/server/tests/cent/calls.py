"""Centrifugo's Python server SDK (`cent`, from PyPI) against Herald's Centrifugo API.

Run by crates/server/tests/it/centrifugo.rs with the API's base URL and key: each call
prints one JSON line, {"call": NAME, "result": …} or {"call": NAME, "error": …}, and the
test asserts on them. This script decides nothing.
"""

import json
import sys

from cent import (
    BatchRequest,
    BroadcastRequest,
    ChannelsRequest,
    Client,
    CentApiResponseError,
    DisconnectRequest,
    HistoryRemoveRequest,
    HistoryRequest,
    InfoRequest,
    PresenceRequest,
    PresenceStatsRequest,
    PublishRequest,
    StreamPosition,
    UnsubscribeRequest,
)

url, key, channel = sys.argv[1:4]
client = Client(url, key)


def dump(result):
    """A result as JSON; a batch's replies each as their own type (pydantic would dump them
    as the list's declared base type, which has no fields)."""
    said = result.model_dump(mode="json")
    if hasattr(result, "replies"):
        said["replies"] = [r.model_dump(mode="json") for r in result.replies]
    return said


def call(name, method, request):
    try:
        result = method(request)
        said = {"call": name, "result": dump(result) if result else None}
    except CentApiResponseError as e:
        said = {"call": name, "error": {"code": e.code, "message": e.message}}
    print(json.dumps(said), flush=True)
    return result if "result" in said else None


published = call("publish", client.publish, PublishRequest(channel=channel, data={"n": 1}))
call("broadcast", client.broadcast, BroadcastRequest(channels=[channel, channel + "-2"], data={"n": 2}))
call("history", client.history, HistoryRequest(channel=channel, limit=10))
call(
    "history_since",
    client.history,
    HistoryRequest(channel=channel, limit=10, since=StreamPosition(offset=1, epoch=published.epoch)),
)
call("presence", client.presence, PresenceRequest(channel=channel))
call("presence_stats", client.presence_stats, PresenceStatsRequest(channel=channel))
call("channels", client.channels, ChannelsRequest(pattern="chat:*"))
call("channels_none", client.channels, ChannelsRequest(pattern="news:*"))
call("info", client.info, InfoRequest())
call(
    "batch",
    client.batch,
    BatchRequest(
        requests=[
            PublishRequest(channel=channel, data={"n": 3}),
            PresenceStatsRequest(channel=channel),
            HistoryRequest(channel=channel, limit=-1),
        ]
    ),
)
call("unsubscribe", client.unsubscribe, UnsubscribeRequest(user="nobody", channel=channel))
call("disconnect", client.disconnect, DisconnectRequest(user="nobody"))
call("history_remove", client.history_remove, HistoryRemoveRequest(channel=channel))
call("bad_channel", client.publish, PublishRequest(channel="bad channel", data={}))
