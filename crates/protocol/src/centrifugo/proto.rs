//! The messages of Centrifugo's Protobuf protocol that Herald reads and writes, as
//! `centrifugal/protocol`'s `client.proto` numbers their fields (fields Herald never uses
//! are left out: Protobuf skips what a message does not declare).

#![allow(missing_docs)]

use std::collections::HashMap;

#[derive(Clone, PartialEq, prost::Message)]
pub struct Command {
    #[prost(uint32, tag = "1")]
    pub id: u32,
    #[prost(message, optional, tag = "4")]
    pub connect: Option<ConnectRequest>,
    #[prost(message, optional, tag = "5")]
    pub subscribe: Option<SubscribeRequest>,
    #[prost(message, optional, tag = "6")]
    pub unsubscribe: Option<ChannelRequest>,
    #[prost(message, optional, tag = "7")]
    pub publish: Option<PublishRequest>,
    #[prost(message, optional, tag = "8")]
    pub presence: Option<ChannelRequest>,
    #[prost(message, optional, tag = "9")]
    pub presence_stats: Option<ChannelRequest>,
    #[prost(message, optional, tag = "10")]
    pub history: Option<HistoryRequest>,
    #[prost(message, optional, tag = "11")]
    pub ping: Option<Empty>,
    #[prost(message, optional, tag = "12")]
    pub send: Option<Empty>,
    #[prost(message, optional, tag = "13")]
    pub rpc: Option<RpcRequest>,
    #[prost(message, optional, tag = "14")]
    pub refresh: Option<RefreshRequest>,
    #[prost(message, optional, tag = "15")]
    pub sub_refresh: Option<SubRefreshRequest>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Empty {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ConnectRequest {
    #[prost(string, tag = "1")]
    pub token: String,
    #[prost(string, tag = "4")]
    pub name: String,
    #[prost(string, tag = "5")]
    pub version: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SubscribeRequest {
    #[prost(string, tag = "1")]
    pub channel: String,
    #[prost(string, tag = "2")]
    pub token: String,
    #[prost(bool, tag = "3")]
    pub recover: bool,
    #[prost(string, tag = "6")]
    pub epoch: String,
    #[prost(uint64, tag = "7")]
    pub offset: u64,
    #[prost(string, tag = "12")]
    pub delta: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ChannelRequest {
    #[prost(string, tag = "1")]
    pub channel: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PublishRequest {
    #[prost(string, tag = "1")]
    pub channel: String,
    #[prost(bytes = "vec", tag = "2")]
    pub data: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StreamPosition {
    #[prost(uint64, tag = "1")]
    pub offset: u64,
    #[prost(string, tag = "2")]
    pub epoch: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HistoryRequest {
    #[prost(string, tag = "1")]
    pub channel: String,
    #[prost(int32, tag = "7")]
    pub limit: i32,
    #[prost(message, optional, tag = "8")]
    pub since: Option<StreamPosition>,
    #[prost(bool, tag = "9")]
    pub reverse: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RpcRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub data: Vec<u8>,
    #[prost(string, tag = "2")]
    pub method: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RefreshRequest {
    #[prost(string, tag = "1")]
    pub token: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SubRefreshRequest {
    #[prost(string, tag = "1")]
    pub channel: String,
    #[prost(string, tag = "2")]
    pub token: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Reply {
    #[prost(uint32, tag = "1")]
    pub id: u32,
    #[prost(message, optional, tag = "2")]
    pub error: Option<Error>,
    #[prost(message, optional, tag = "4")]
    pub push: Option<Push>,
    #[prost(message, optional, tag = "5")]
    pub connect: Option<ConnectResult>,
    #[prost(message, optional, tag = "6")]
    pub subscribe: Option<SubscribeResult>,
    #[prost(message, optional, tag = "7")]
    pub unsubscribe: Option<Empty>,
    #[prost(message, optional, tag = "8")]
    pub publish: Option<Empty>,
    #[prost(message, optional, tag = "9")]
    pub presence: Option<PresenceResult>,
    #[prost(message, optional, tag = "10")]
    pub presence_stats: Option<PresenceStatsResult>,
    #[prost(message, optional, tag = "11")]
    pub history: Option<HistoryResult>,
    #[prost(message, optional, tag = "12")]
    pub ping: Option<Empty>,
    #[prost(message, optional, tag = "13")]
    pub rpc: Option<RpcResult>,
    #[prost(message, optional, tag = "14")]
    pub refresh: Option<RefreshResult>,
    #[prost(message, optional, tag = "15")]
    pub sub_refresh: Option<SubRefreshResult>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Error {
    #[prost(uint32, tag = "1")]
    pub code: u32,
    #[prost(string, tag = "2")]
    pub message: String,
    #[prost(bool, tag = "3")]
    pub temporary: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Push {
    #[prost(string, tag = "2")]
    pub channel: String,
    #[prost(message, optional, tag = "4")]
    pub r#pub: Option<Publication>,
    #[prost(message, optional, tag = "5")]
    pub join: Option<Member>,
    #[prost(message, optional, tag = "6")]
    pub leave: Option<Member>,
    #[prost(message, optional, tag = "7")]
    pub unsubscribe: Option<Unsubscribe>,
    #[prost(message, optional, tag = "9")]
    pub subscribe: Option<Subscribe>,
    #[prost(message, optional, tag = "10")]
    pub connect: Option<ConnectResult>,
    #[prost(message, optional, tag = "11")]
    pub disconnect: Option<Disconnect>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ClientInfo {
    #[prost(string, tag = "1")]
    pub user: String,
    #[prost(string, tag = "2")]
    pub client: String,
    #[prost(bytes = "vec", tag = "3")]
    pub conn_info: Vec<u8>,
    #[prost(bytes = "vec", tag = "4")]
    pub chan_info: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Publication {
    #[prost(bytes = "vec", tag = "4")]
    pub data: Vec<u8>,
    #[prost(message, optional, tag = "5")]
    pub info: Option<ClientInfo>,
    #[prost(uint64, tag = "6")]
    pub offset: u64,
    #[prost(bool, tag = "8")]
    pub delta: bool,
}

/// A join or a leave.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Member {
    #[prost(message, optional, tag = "1")]
    pub info: Option<ClientInfo>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Unsubscribe {
    #[prost(uint32, tag = "2")]
    pub code: u32,
    #[prost(string, tag = "3")]
    pub reason: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Subscribe {
    #[prost(bool, tag = "1")]
    pub recoverable: bool,
    #[prost(string, tag = "4")]
    pub epoch: String,
    #[prost(uint64, tag = "5")]
    pub offset: u64,
    #[prost(bool, tag = "6")]
    pub positioned: bool,
    #[prost(bytes = "vec", tag = "7")]
    pub data: Vec<u8>,
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

#[derive(Clone, PartialEq, prost::Message)]
pub struct ConnectResult {
    #[prost(string, tag = "1")]
    pub client: String,
    #[prost(string, tag = "2")]
    pub version: String,
    #[prost(bool, tag = "3")]
    pub expires: bool,
    #[prost(uint32, tag = "4")]
    pub ttl: u32,
    #[prost(uint32, tag = "7")]
    pub ping: u32,
    #[prost(bool, tag = "8")]
    pub pong: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SubscribeResult {
    #[prost(bool, tag = "3")]
    pub recoverable: bool,
    #[prost(string, tag = "6")]
    pub epoch: String,
    #[prost(message, repeated, tag = "7")]
    pub publications: Vec<Publication>,
    #[prost(bool, tag = "8")]
    pub recovered: bool,
    #[prost(uint64, tag = "9")]
    pub offset: u64,
    #[prost(bool, tag = "10")]
    pub positioned: bool,
    #[prost(bytes = "vec", tag = "11")]
    pub data: Vec<u8>,
    #[prost(bool, tag = "12")]
    pub was_recovering: bool,
    #[prost(bool, tag = "13")]
    pub delta: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PresenceResult {
    #[prost(map = "string, message", tag = "1")]
    pub presence: HashMap<String, ClientInfo>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PresenceStatsResult {
    #[prost(uint32, tag = "1")]
    pub num_clients: u32,
    #[prost(uint32, tag = "2")]
    pub num_users: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HistoryResult {
    #[prost(message, repeated, tag = "1")]
    pub publications: Vec<Publication>,
    #[prost(string, tag = "2")]
    pub epoch: String,
    #[prost(uint64, tag = "3")]
    pub offset: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RpcResult {
    #[prost(bytes = "vec", tag = "1")]
    pub data: Vec<u8>,
}

/// `refresh` (client 1, version 2 left out) and `sub_refresh` share their expiry fields'
/// numbers only from 3 on for `refresh`: each has its own message.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RefreshResult {
    #[prost(bool, tag = "3")]
    pub expires: bool,
    #[prost(uint32, tag = "4")]
    pub ttl: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SubRefreshResult {
    #[prost(bool, tag = "1")]
    pub expires: bool,
    #[prost(uint32, tag = "2")]
    pub ttl: u32,
}
