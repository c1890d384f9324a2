// A centrifuge-go client driven by the Herald test that starts it
// (crates/server/tests/it/centrifugo.rs): it reads one command per line on stdin, as
// JSON, and prints what happens, one JSON object per line on stdout. The test asserts on
// those lines; this program decides nothing.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/centrifugal/centrifuge-go"
)

// command is one line of stdin.
type command struct {
	Do        string          `json:"do"`
	Channel   string          `json:"channel"`
	Data      json.RawMessage `json:"data"`
	Limit     int32           `json:"limit"`
	JoinLeave bool            `json:"join_leave"`
	Delta     bool            `json:"delta"`
	Method    string          `json:"method"`
}

var out = struct {
	sync.Mutex
	*json.Encoder
}{Encoder: json.NewEncoder(os.Stdout)}

// say prints one event or reply as a line of JSON.
func say(fields map[string]any) {
	out.Lock()
	defer out.Unlock()
	if err := out.Encode(fields); err != nil {
		fmt.Fprintln(os.Stderr, "cannot write:", err)
		os.Exit(2)
	}
}

// reply prints the outcome of a command: its result's fields, or its error.
func reply(to string, fields map[string]any, err error) {
	if fields == nil {
		fields = map[string]any{}
	}
	fields["reply"] = to
	if err != nil {
		fields["error"] = err.Error()
		if e, ok := err.(*centrifuge.Error); ok {
			fields["code"] = e.Code
		}
	}
	say(fields)
}

func info(i *centrifuge.ClientInfo) map[string]any {
	if i == nil {
		return nil
	}
	return map[string]any{
		"client":    i.Client,
		"user":      i.User,
		"conn_info": json.RawMessage(orNull(i.ConnInfo)),
		"chan_info": json.RawMessage(orNull(i.ChanInfo)),
	}
}

func orNull(b []byte) []byte {
	if len(b) == 0 {
		return []byte("null")
	}
	return b
}

func main() {
	url := flag.String("url", "", "Herald's Centrifugo endpoint (ws://…/centrifugo/connection/websocket)")
	protobuf := flag.Bool("protobuf", false, "speak Centrifugo's Protobuf codec")
	token := flag.String("token", "", "connection JWT")
	pingDelay := flag.Duration("max-ping-delay", 10*time.Second, "how late a server ping may be")
	flag.Parse()

	config := centrifuge.Config{
		Token:              *token,
		Name:               "herald-test",
		MaxServerPingDelay: *pingDelay,
		MinReconnectDelay:  50 * time.Millisecond,
		MaxReconnectDelay:  300 * time.Millisecond,
	}
	var client *centrifuge.Client
	if *protobuf {
		client = centrifuge.NewProtobufClient(*url, config)
	} else {
		client = centrifuge.NewJsonClient(*url, config)
	}
	defer client.Close()

	client.OnConnected(func(e centrifuge.ConnectedEvent) {
		say(map[string]any{"event": "connected", "client": e.ClientID})
	})
	client.OnDisconnected(func(e centrifuge.DisconnectedEvent) {
		say(map[string]any{"event": "disconnected", "code": e.Code, "reason": e.Reason})
	})
	client.OnConnecting(func(e centrifuge.ConnectingEvent) {
		say(map[string]any{"event": "connecting", "code": e.Code, "reason": e.Reason})
	})
	client.OnError(func(e centrifuge.ErrorEvent) {
		say(map[string]any{"event": "error", "error": e.Error.Error()})
	})
	client.OnSubscribed(func(e centrifuge.ServerSubscribedEvent) {
		say(map[string]any{"event": "server_subscribed", "channel": e.Channel})
	})
	client.OnPublication(func(e centrifuge.ServerPublicationEvent) {
		say(map[string]any{"event": "server_publication", "channel": e.Channel,
			"offset": e.Offset, "data": json.RawMessage(e.Data)})
	})

	subs := map[string]*centrifuge.Subscription{}
	ctx := context.Background()
	lines := bufio.NewScanner(os.Stdin)
	for lines.Scan() {
		var c command
		if err := json.Unmarshal(lines.Bytes(), &c); err != nil {
			fmt.Fprintln(os.Stderr, "bad command:", err)
			os.Exit(2)
		}
		switch c.Do {
		case "connect":
			reply("connect", nil, client.Connect())
		case "disconnect":
			reply("disconnect", nil, client.Disconnect())
		case "subscribe":
			subs[c.Channel] = subscribe(client, c)
		case "unsubscribe":
			reply("unsubscribe", nil, subs[c.Channel].Unsubscribe())
		case "publish":
			_, err := client.Publish(ctx, c.Channel, c.Data)
			reply("publish", nil, err)
		case "history":
			h, err := client.History(ctx, c.Channel, centrifuge.WithHistoryLimit(c.Limit))
			pubs := []map[string]any{}
			for _, p := range h.Publications {
				pubs = append(pubs, map[string]any{"offset": p.Offset, "data": json.RawMessage(p.Data)})
			}
			reply("history", map[string]any{"publications": pubs, "offset": h.Offset, "epoch": h.Epoch}, err)
		case "presence":
			p, err := client.Presence(ctx, c.Channel)
			clients := map[string]any{}
			for id, i := range p.Clients {
				clients[id] = info(&i)
			}
			reply("presence", map[string]any{"clients": clients}, err)
		case "presence_stats":
			s, err := client.PresenceStats(ctx, c.Channel)
			reply("presence_stats", map[string]any{"clients": s.NumClients, "users": s.NumUsers}, err)
		case "rpc":
			r, err := client.RPC(ctx, c.Method, c.Data)
			reply("rpc", map[string]any{"data": json.RawMessage(orNull(r.Data))}, err)
		case "quit":
			return
		default:
			fmt.Fprintln(os.Stderr, "unknown command:", c.Do)
			os.Exit(2)
		}
	}
}

// subscribe makes a subscription that prints its events, and subscribes it.
func subscribe(client *centrifuge.Client, c command) *centrifuge.Subscription {
	config := centrifuge.SubscriptionConfig{Recoverable: true, Positioned: true, JoinLeave: c.JoinLeave}
	if c.Delta {
		config.Delta = centrifuge.DeltaTypeFossil
	}
	sub, err := client.NewSubscription(c.Channel, config)
	if err != nil {
		reply("subscribe", nil, err)
		return nil
	}
	channel := c.Channel
	sub.OnSubscribed(func(e centrifuge.SubscribedEvent) {
		fields := map[string]any{"event": "subscribed", "channel": channel,
			"was_recovering": e.WasRecovering, "recovered": e.Recovered}
		if e.StreamPosition != nil {
			fields["offset"] = e.StreamPosition.Offset
			fields["epoch"] = e.StreamPosition.Epoch
		}
		say(fields)
	})
	sub.OnUnsubscribed(func(e centrifuge.UnsubscribedEvent) {
		say(map[string]any{"event": "unsubscribed", "channel": channel, "code": e.Code, "reason": e.Reason})
	})
	sub.OnSubscribing(func(e centrifuge.SubscribingEvent) {
		say(map[string]any{"event": "subscribing", "channel": channel, "code": e.Code, "reason": e.Reason})
	})
	sub.OnError(func(e centrifuge.SubscriptionErrorEvent) {
		say(map[string]any{"event": "subscription_error", "channel": channel, "error": e.Error.Error()})
	})
	sub.OnPublication(func(e centrifuge.PublicationEvent) {
		say(map[string]any{"event": "publication", "channel": channel, "offset": e.Offset,
			"data": json.RawMessage(e.Data), "info": info(e.Info)})
	})
	sub.OnJoin(func(e centrifuge.JoinEvent) {
		say(map[string]any{"event": "join", "channel": channel, "client": e.Client, "user": e.User})
	})
	sub.OnLeave(func(e centrifuge.LeaveEvent) {
		say(map[string]any{"event": "leave", "channel": channel, "client": e.Client, "user": e.User})
	})
	reply("subscribe", nil, sub.Subscribe())
	return sub
}
