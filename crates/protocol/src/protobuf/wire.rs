//! The messages of `proto/herald.proto`, as prost reads and writes them. Written by hand
//! (no protoc at build time); the SDK's tests read the golden frames with the `.proto`
//! file itself, so the two cannot drift apart unseen.

#![allow(missing_docs)]

#[derive(Clone, PartialEq, prost::Message)]
pub struct Command {
    #[prost(uint64, optional, tag = "1")]
    pub id: Option<u64>,
    #[prost(oneof = "Method", tags = "2, 3, 4, 5, 6, 7, 8, 9, 10, 11")]
    pub method: Option<Method>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Method {
    #[prost(message, tag = "2")]
    Connect(Connect),
    #[prost(message, tag = "3")]
    Subscribe(Subscribe),
    #[prost(message, tag = "4")]
    Unsubscribe(Channel),
    #[prost(message, tag = "5")]
    Publish(Publish),
    #[prost(message, tag = "6")]
    History(History),
    #[prost(message, tag = "7")]
    Refresh(Refresh),
    #[prost(message, tag = "8")]
    Rpc(Rpc),
    #[prost(message, tag = "9")]
    Presence(PresencePage),
    #[prost(message, tag = "10")]
    PresenceStats(Channel),
    #[prost(message, tag = "11")]
    Ping(Empty),
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Empty {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Connect {
    #[prost(string, optional, tag = "1")]
    pub token: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub name: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub version: Option<String>,
    #[prost(string, optional, tag = "4")]
    pub client: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Since {
    #[prost(uint64, tag = "1")]
    pub offset: u64,
    #[prost(string, optional, tag = "2")]
    pub epoch: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Subscribe {
    #[prost(string, tag = "1")]
    pub channel: String,
    #[prost(message, optional, tag = "2")]
    pub since: Option<Since>,
    #[prost(string, optional, tag = "3")]
    pub token: Option<String>,
    #[prost(string, tag = "4")]
    pub delta: String,
    #[prost(bool, tag = "5")]
    pub conflate: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Channel {
    #[prost(string, tag = "1")]
    pub channel: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Publish {
    #[prost(string, tag = "1")]
    pub channel: String,
    #[prost(bytes = "vec", tag = "2")]
    pub data: Vec<u8>,
    #[prost(string, optional, tag = "3")]
    pub idempotency_key: Option<String>,
    #[prost(string, optional, tag = "4")]
    pub conflation_key: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct History {
    #[prost(string, tag = "1")]
    pub channel: String,
    #[prost(message, optional, tag = "2")]
    pub since: Option<Since>,
    #[prost(uint32, optional, tag = "3")]
    pub limit: Option<u32>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Refresh {
    #[prost(string, optional, tag = "1")]
    pub channel: Option<String>,
    #[prost(string, tag = "2")]
    pub token: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Rpc {
    #[prost(string, tag = "1")]
    pub method: String,
    #[prost(bytes = "vec", tag = "2")]
    pub data: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PresencePage {
    #[prost(string, tag = "1")]
    pub channel: String,
    #[prost(uint32, optional, tag = "2")]
    pub limit: Option<u32>,
    #[prost(string, optional, tag = "3")]
    pub cursor: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ServerMessage {
    #[prost(uint64, optional, tag = "1")]
    pub id: Option<u64>,
    #[prost(
        oneof = "Body",
        tags = "2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15"
    )]
    pub body: Option<Body>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Body {
    #[prost(message, tag = "2")]
    Error(Error),
    #[prost(message, tag = "3")]
    Connect(ConnectResult),
    #[prost(message, tag = "4")]
    Subscribe(Stream),
    #[prost(message, tag = "5")]
    Unsubscribe(Unsubscribe),
    #[prost(message, tag = "6")]
    Publish(PublishResult),
    #[prost(message, tag = "7")]
    History(Stream),
    #[prost(message, tag = "8")]
    Refresh(Expiry),
    #[prost(message, tag = "9")]
    Rpc(RpcResult),
    #[prost(message, tag = "10")]
    Presence(Presence),
    #[prost(message, tag = "11")]
    PresenceStats(PresenceStats),
    #[prost(message, tag = "12")]
    Ping(Empty),
    #[prost(message, tag = "13")]
    Pub(Pub),
    #[prost(message, tag = "14")]
    Disconnect(Disconnect),
    #[prost(message, tag = "15")]
    Conflated(Conflated),
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Conflated {
    #[prost(string, tag = "1")]
    pub channel: String,
    #[prost(uint64, tag = "2")]
    pub offset: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Error {
    #[prost(uint32, tag = "1")]
    pub code: u32,
    #[prost(string, tag = "2")]
    pub message: String,
    #[prost(string, optional, tag = "3")]
    pub channel: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ConnectResult {
    #[prost(string, tag = "1")]
    pub client: String,
    #[prost(string, tag = "2")]
    pub version: String,
    #[prost(uint64, tag = "3")]
    pub ping: u64,
    #[prost(string, optional, tag = "4")]
    pub user: Option<String>,
    #[prost(uint64, optional, tag = "5")]
    pub expires: Option<u64>,
    #[prost(uint64, optional, tag = "6")]
    pub ttl: Option<u64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Expiry {
    #[prost(uint64, optional, tag = "1")]
    pub expires: Option<u64>,
    #[prost(uint64, optional, tag = "2")]
    pub ttl: Option<u64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Stream {
    #[prost(string, optional, tag = "1")]
    pub channel: Option<String>,
    #[prost(string, tag = "2")]
    pub epoch: String,
    #[prost(uint64, tag = "3")]
    pub offset: u64,
    #[prost(bool, optional, tag = "4")]
    pub recovered: Option<bool>,
    #[prost(message, repeated, tag = "5")]
    pub publications: Vec<Publication>,
    #[prost(bytes = "vec", optional, tag = "6")]
    pub data: Option<Vec<u8>>,
    #[prost(string, optional, tag = "7")]
    pub delta: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Publication {
    #[prost(uint64, tag = "1")]
    pub offset: u64,
    #[prost(bytes = "vec", tag = "2")]
    pub data: Vec<u8>,
    #[prost(bytes = "vec", optional, tag = "3")]
    pub from: Option<Vec<u8>>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Unsubscribe {
    #[prost(string, optional, tag = "1")]
    pub channel: Option<String>,
    #[prost(uint32, optional, tag = "2")]
    pub code: Option<u32>,
    #[prost(string, optional, tag = "3")]
    pub reason: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PublishResult {
    #[prost(uint64, tag = "1")]
    pub offset: u64,
    #[prost(string, tag = "2")]
    pub epoch: String,
    #[prost(bool, optional, tag = "3")]
    pub repeat: Option<bool>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RpcResult {
    #[prost(bytes = "vec", tag = "1")]
    pub data: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Member {
    #[prost(string, tag = "1")]
    pub client: String,
    #[prost(bytes = "vec", optional, tag = "2")]
    pub fields: Option<Vec<u8>>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Presence {
    #[prost(string, optional, tag = "1")]
    pub channel: Option<String>,
    #[prost(message, repeated, tag = "2")]
    pub members: Vec<Member>,
    #[prost(string, optional, tag = "3")]
    pub cursor: Option<String>,
    #[prost(message, repeated, tag = "4")]
    pub join: Vec<Member>,
    #[prost(message, repeated, tag = "5")]
    pub leave: Vec<Member>,
    #[prost(bool, optional, tag = "6")]
    pub missed: Option<bool>,
    #[prost(uint64, optional, tag = "7")]
    pub clients: Option<u64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PresenceStats {
    #[prost(uint64, tag = "1")]
    pub clients: u64,
    #[prost(uint64, tag = "2")]
    pub users: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Pub {
    #[prost(string, tag = "1")]
    pub channel: String,
    #[prost(uint64, tag = "2")]
    pub offset: u64,
    #[prost(bytes = "vec", optional, tag = "3")]
    pub data: Option<Vec<u8>>,
    #[prost(bytes = "vec", optional, tag = "4")]
    pub from: Option<Vec<u8>>,
    #[prost(bytes = "vec", optional, tag = "5")]
    pub full: Option<Vec<u8>>,
    #[prost(bytes = "vec", optional, tag = "6")]
    pub delta: Option<Vec<u8>>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Disconnect {
    #[prost(uint32, tag = "1")]
    pub code: u32,
    #[prost(string, tag = "2")]
    pub reason: String,
    #[prost(bool, tag = "3")]
    pub reconnect: bool,
}
