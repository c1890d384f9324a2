//! Centrifugo's server API at `[centrifugo] api_path` (`/centrifugo/api`): a backend
//! written against Centrifugo (its `cent`/`gocent`/… SDKs, or plain HTTP) keeps its calls.
//! `POST {api_path}/{method}` with a JSON body and the key in `X-API-Key` (or
//! `Authorization: apikey KEY`); the answer is `{"result": …}` or, with status 200 as
//! Centrifugo answers, `{"error": {"code", "message"}}`. Each method is Herald's API call
//! of the same meaning, under the same key scopes: reads need a read key, publishing a
//! publish key, acting on connections a key without a scope.

use std::sync::Arc;

use axum::{
    body::Bytes,
    extract::{rejection::BytesRejection, Path, State},
    http::{header, HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::post,
    Router,
};
use herald_protocol::{
    centrifugo::{api_result, Position},
    json, results, ChannelName, Epoch, ErrorCode, Outcome,
};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::{admin, config::ApiScope, error::Failure, node::Node, registry::Who};

/// The API's route, at `[centrifugo] api_path`.
pub fn routes(node: &Node) -> Router<Arc<Node>> {
    let path = format!("{}/{{method}}", node.settings.config.centrifugo.api_path);
    Router::new().route(&path, post(call))
}

async fn call(
    State(node): State<Arc<Node>>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    if !node.settings.config.centrifugo.enabled {
        let off = "the Centrifugo front is off ([centrifugo] enabled = false)";
        return Failure::new(ErrorCode::MethodNotFound, off).into_response();
    }
    let Some(method) = Method::named(&method) else {
        let known: Vec<&str> = Method::ALL.iter().map(|(name, _)| *name).collect();
        let message = format!(
            "unknown method {method:?}; this API serves {}",
            known.join(", ")
        );
        return (
            StatusCode::NOT_FOUND,
            error(ErrorCode::MethodNotFound, &message),
        )
            .into_response();
    };
    let given = key(&headers);
    let expected = "`X-API-Key: KEY` (or `Authorization: apikey KEY`)";
    // Whether the key covers a scope; `None`: whether it is a key at all (of any scope).
    let may = |needed: Option<ApiScope>| {
        let check =
            |scope| crate::policy::api_key::check_scope(&node.settings, scope, given, expected);
        match needed {
            Some(scope) => check(scope),
            None => check(ApiScope::Read).or_else(|_| check(ApiScope::Publish)),
        }
    };
    if let Err(f) = may(method.scope()) {
        return f.into_response();
    }
    let answered = match body {
        Ok(body) if matches!(method, Method::Batch) => batch(&node, &body, &may).await,
        Ok(body) => answer(&node, method, &body).await,
        Err(e) => Err(Failure::new(
            ErrorCode::MessageTooLarge,
            format!("cannot read request body: {e}"),
        )),
    };
    let body = answered.unwrap_or_else(|f| error(f.code, &f.message));
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// The methods this API serves.
#[derive(Debug, Clone, Copy)]
enum Method {
    Publish,
    Broadcast,
    History,
    HistoryRemove,
    Presence,
    PresenceStats,
    Unsubscribe,
    Disconnect,
    Channels,
    Info,
    Batch,
}

impl Method {
    /// Each with its name in the path.
    const ALL: [(&'static str, Method); 11] = [
        ("publish", Method::Publish),
        ("broadcast", Method::Broadcast),
        ("history", Method::History),
        ("history_remove", Method::HistoryRemove),
        ("presence", Method::Presence),
        ("presence_stats", Method::PresenceStats),
        ("unsubscribe", Method::Unsubscribe),
        ("disconnect", Method::Disconnect),
        ("channels", Method::Channels),
        ("info", Method::Info),
        ("batch", Method::Batch),
    ];

    fn named(name: &str) -> Option<Method> {
        Self::ALL.iter().find(|(n, _)| *n == name).map(|(_, m)| *m)
    }

    /// The key scope it needs; `None` (a batch): any key, each command in it checked
    /// against the key's scope on its own.
    fn scope(self) -> Option<ApiScope> {
        Some(match self {
            Method::Publish | Method::Broadcast | Method::HistoryRemove => ApiScope::Publish,
            Method::History
            | Method::Presence
            | Method::PresenceStats
            | Method::Channels
            | Method::Info => ApiScope::Read,
            Method::Unsubscribe | Method::Disconnect => ApiScope::All,
            Method::Batch => return None,
        })
    }
}

/// The key: Centrifugo's header, or Herald's.
fn key(headers: &HeaderMap) -> Option<&str> {
    let centrifugos = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    centrifugos
        .map(str::trim)
        .or_else(|| crate::policy::api_key::authorization(headers))
}

/// Centrifugo's error body.
fn error(code: ErrorCode, message: &str) -> Vec<u8> {
    let body = serde_json::json!({ "error": { "code": code, "message": message } });
    serde_json::to_vec(&body).expect("errors serialise")
}

/// The result of a method that answers nothing more.
const DONE: &[u8] = br#"{"result":{}}"#;

/// What a method's body asks; fields Centrifugo has and Herald does not (`tags`,
/// `skip_history`, …) are ignored, as the client front ignores them.
#[derive(Deserialize)]
struct Request<'a> {
    #[serde(default)]
    channel: Option<String>,
    #[serde(default)]
    channels: Vec<String>,
    #[serde(borrow, default)]
    data: Option<&'a RawValue>,
    #[serde(default)]
    b64data: Option<String>,
    #[serde(default)]
    idempotency_key: Option<String>,
    #[serde(default)]
    limit: Option<i64>,
    #[serde(default)]
    since: Option<Position>,
    #[serde(default)]
    reverse: bool,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    client: Option<String>,
    #[serde(default)]
    disconnect: Option<DisconnectWith>,
    #[serde(default)]
    pattern: Option<String>,
}

#[derive(Deserialize)]
struct DisconnectWith {
    code: u16,
    #[serde(default)]
    reason: String,
}

impl Request<'_> {
    fn channel(&self) -> Result<ChannelName, Failure> {
        let name = self
            .channel
            .as_deref()
            .ok_or_else(|| Failure::new(ErrorCode::BadRequest, "channel is required"))?;
        crate::api::channel(name)
    }

    fn data(&self) -> Result<Bytes, Failure> {
        if self.b64data.is_some() {
            return Err(Failure::new(
                ErrorCode::BadRequest,
                "b64data is not supported: Herald keeps JSON, send data",
            ));
        }
        let raw = self
            .data
            .ok_or_else(|| Failure::new(ErrorCode::BadRequest, "data is required"))?;
        json::payload(raw).map_err(|m| Failure::new(ErrorCode::BadRequest, m))
    }

    /// Whose connections: Centrifugo names a user, and a client to narrow it to one.
    fn who(&self) -> Result<Who, Failure> {
        match (&self.client, &self.user) {
            (Some(client), _) if !client.is_empty() => Ok(Who::Client(client.clone())),
            (_, Some(user)) if !user.is_empty() => Ok(Who::User(user.clone())),
            _ => Err(Failure::new(ErrorCode::BadRequest, "user is required")),
        }
    }
}

async fn answer(node: &Arc<Node>, method: Method, body: &[u8]) -> Result<Vec<u8>, Failure> {
    let req: Request<'_> = serde_json::from_slice(body)
        .map_err(|e| Failure::new(ErrorCode::BadRequest, format!("invalid JSON body: {e}")))?;
    let key = req
        .idempotency_key
        .as_deref()
        .map(|k| (k, crate::publish::Publisher::Backend));
    match method {
        Method::Publish => {
            let channel = req.channel()?;
            let p = crate::publish::publish_keyed(node, &channel, (req.data()?, None), None, key)
                .await?;
            Ok(published(p.position.offset, &p.position.epoch))
        }
        Method::Broadcast => {
            if req.channels.is_empty() {
                return Err(Failure::new(ErrorCode::BadRequest, "channels is empty"));
            }
            let data = req.data()?;
            // `{"result":{"responses":[R, …]}}`, each R a publish's answer as it is.
            let mut body = br#"{"result":{"responses":["#.to_vec();
            for (i, name) in req.channels.iter().enumerate() {
                let done = match crate::api::channel(name) {
                    Ok(c) => {
                        crate::publish::publish_keyed(node, &c, (data.clone(), None), None, key)
                            .await
                            .map(|p| published(p.position.offset, &p.position.epoch))
                    }
                    Err(f) => Err(f),
                };
                if i > 0 {
                    body.push(b',');
                }
                body.extend(done.unwrap_or_else(|f| error(f.code, &f.message)));
            }
            body.extend_from_slice(b"]}}");
            Ok(body)
        }
        Method::History => {
            if req.reverse {
                let why = "history in reverse order is not supported";
                return Err(Failure::new(ErrorCode::BadRequest, why));
            }
            let channel = req.channel()?;
            let since = req.since.as_ref().map(Position::since);
            // Centrifugo: no limit (or 0) asks for the stream's position only; -1 for all
            // (up to `client.max_history_limit`).
            let limit = match req.limit.unwrap_or(0) {
                0 => Some(0),
                n => usize::try_from(n).ok(),
            };
            let h = crate::history::read(node, &channel, since, limit).await?;
            Ok(api_result(&Outcome::History(results::Stream {
                epoch: &h.position.epoch,
                offset: h.position.offset,
                recovered: None,
                publications: &h.publications,
                data: None,
                delta: None,
            })))
        }
        Method::HistoryRemove => {
            node.broker.remove_history(&req.channel()?).await?;
            Ok(DONE.to_vec())
        }
        Method::Presence => {
            let channel = req.channel()?;
            crate::policy::presence_kept(node, &channel)?;
            let (members, _) = node.presence.page(&channel, None, None).await?;
            let members = crate::hub::presence::listed(&members);
            Ok(api_result(&Outcome::Presence(results::Presence {
                members: &members,
                cursor: None,
            })))
        }
        Method::PresenceStats => {
            let channel = req.channel()?;
            crate::policy::presence_kept(node, &channel)?;
            let stats = node.presence.stats(&channel).await?;
            Ok(api_result(&Outcome::PresenceStats(
                results::PresenceStats {
                    clients: stats.clients,
                    users: stats.users,
                },
            )))
        }
        Method::Unsubscribe => {
            let action = admin::checked(admin::Action::Unsubscribe {
                who: req.who()?,
                channel: req.channel()?.to_string(),
            })?;
            admin::everywhere(node, action).await?;
            Ok(DONE.to_vec())
        }
        Method::Disconnect => {
            let (code, reason) = match req.disconnect {
                Some(ref d) => (d.code, d.reason.clone()),
                None => (
                    herald_protocol::DisconnectCode::ForceReconnect.code(),
                    "disconnected by the server's operator".into(),
                ),
            };
            let action = admin::checked(admin::Action::Disconnect {
                who: req.who()?,
                code,
                reason,
            })?;
            admin::everywhere(node, action).await?;
            Ok(DONE.to_vec())
        }
        Method::Channels => channels(node, req.pattern.as_deref().unwrap_or("")).await,
        Method::Info => {
            // Centrifugo's Node for each of Herald's nodes. Subscriptions and users are
            // counted for this one only, here: counting them walks every channel and
            // connection, too much for the figures a node reports every 2 s.
            let own = (node.hub.subscription_count(), node.sessions.user_count());
            let nodes: Vec<serde_json::Value> = node
                .figures_everywhere()
                .await?
                .iter()
                .map(|f| {
                    let (subs, users) = match f["node"].as_str() == Some(&*node.id) {
                        true => own,
                        false => (0, 0),
                    };
                    serde_json::json!({
                        "uid": f["node"],
                        "name": f["node"],
                        "version": f["version"],
                        "num_clients": f["connections"],
                        "num_users": users,
                        "num_channels": f["subscribed_channels"],
                        "num_subs": subs,
                        "uptime": f["uptime_seconds"],
                    })
                })
                .collect();
            Ok(result(serde_json::json!({ "nodes": nodes })))
        }
        Method::Batch => Err(Failure::new(
            ErrorCode::BadRequest,
            "a batch cannot hold a batch",
        )),
    }
}

/// `{"result": value}`.
fn result(value: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({ "result": value })).expect("results serialise")
}

/// Most channels `channels` lists: Centrifugo answers with a map of them all, in one body.
const MAX_CHANNELS: usize = 100_000;

/// `channels`: the channels with subscribers on any node whose names match `pattern` (a
/// glob: `*` any run of characters, `?` one; empty: all), with their subscribers.
async fn channels(node: &Arc<Node>, pattern: &str) -> Result<Vec<u8>, Failure> {
    const PAGE: usize = admin::MAX_LISTED;
    // The pattern's literal start narrows what each node lists.
    let prefix: String = pattern
        .chars()
        .take_while(|c| !matches!(c, '*' | '?' | '[' | '{' | '\\'))
        .collect();
    let mut found = serde_json::Map::new();
    let mut after = String::new();
    loop {
        let action = admin::checked(admin::Action::Channels {
            after: after.clone(),
            prefix: prefix.clone(),
            limit: PAGE,
        })?;
        let page = admin::everywhere(node, action).await?;
        for c in page["channels"].as_array().into_iter().flatten() {
            if let (Some(name), Some(n)) = (c["channel"].as_str(), c["subscribers"].as_u64()) {
                if glob(pattern, name) {
                    found.insert(name.to_owned(), serde_json::json!({ "num_clients": n }));
                }
            }
        }
        match page["cursor"].as_str() {
            Some(cursor) if found.len() < MAX_CHANNELS => after = cursor.to_owned(),
            _ => break,
        }
    }
    Ok(result(serde_json::json!({ "channels": found })))
}

/// Whether `name` matches `pattern`: `*` any run of characters, `?` any one, the rest
/// itself; an empty pattern matches every name. (Centrifugo's glob also has classes and
/// alternatives; a pattern with them matches only names that spell them out.)
fn glob(pattern: &str, name: &str) -> bool {
    if pattern.is_empty() {
        return true;
    }
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // The usual two-pointer match, going back to the last `*` on a mismatch.
    let (mut i, mut j, mut star, mut mark) = (0, 0, None, 0);
    while j < n.len() {
        if i < p.len() && (p[i] == '?' || p[i] == n[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some(i);
            mark = j;
            i += 1;
        } else if let Some(s) = star {
            i = s + 1;
            mark += 1;
            j = mark;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|c| *c == '*')
}

/// The most commands a batch may hold.
const MAX_BATCH: usize = 1000;

/// `batch`: `{"commands": [{METHOD: REQUEST}, …], "parallel"?}` answered with
/// `{"replies": [{METHOD: RESULT} or {"error": …}, …]}`, one per command, in order; each
/// command is checked against the key's scope as a call of its own would be (`may`).
/// Commands run one after another (`parallel` changes nothing but time).
async fn batch(
    node: &Arc<Node>,
    body: &[u8],
    may: &(dyn Fn(Option<ApiScope>) -> Result<(), Failure> + Sync),
) -> Result<Vec<u8>, Failure> {
    #[derive(Deserialize)]
    struct Batch<'a> {
        #[serde(borrow, default)]
        commands: Vec<std::collections::BTreeMap<String, &'a RawValue>>,
    }
    let batch: Batch<'_> = serde_json::from_slice(body)
        .map_err(|e| Failure::new(ErrorCode::BadRequest, format!("invalid JSON body: {e}")))?;
    if batch.commands.len() > MAX_BATCH {
        let why = format!("a batch holds at most {MAX_BATCH} commands");
        return Err(Failure::new(ErrorCode::BadRequest, why));
    }
    let mut out = br#"{"replies":["#.to_vec();
    for (i, command) in batch.commands.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let mut entries = command.iter();
        let reply = match (entries.next(), entries.next()) {
            (Some((name, request)), None) => match Method::named(name) {
                Some(method) => match may(method.scope()) {
                    Ok(()) => answer(node, method, request.get().as_bytes()).await,
                    Err(f) => Err(f),
                },
                None => Err(Failure::new(
                    ErrorCode::MethodNotFound,
                    format!("unknown method {name:?}"),
                )),
            },
            _ => Err(Failure::new(
                ErrorCode::BadRequest,
                "a command is an object of one method and its request",
            )),
        };
        out.extend(match reply {
            // `{"result":R}` said as `{"METHOD":R}`.
            Ok(body) => match body.strip_prefix(br#"{"result":"#.as_slice()) {
                Some(rest) => {
                    let name = command.keys().next().expect("one method");
                    let mut said = format!("{{{}:", serde_json::to_string(name).expect("a string"))
                        .into_bytes();
                    said.extend_from_slice(rest);
                    said
                }
                None => body,
            },
            Err(f) => error(f.code, &f.message),
        });
    }
    out.extend_from_slice(b"]}");
    Ok(out)
}

/// A publish's result: where it was stored.
fn published(offset: u64, epoch: &Epoch) -> Vec<u8> {
    api_result(&Outcome::Publish(results::Published {
        offset,
        epoch,
        repeat: false,
    }))
}

#[cfg(test)]
mod tests {
    use super::glob;

    #[test]
    fn glob_matches_runs_and_single_characters_and_nothing_else() {
        for (pattern, name) in [
            ("", "chat:a"),
            ("*", "chat:a"),
            ("chat:*", "chat:a"),
            ("chat:*", "chat:"),
            ("*:a", "chat:a"),
            ("c?at:*", "chat:lobby"),
            ("*a*b*", "xaxxbx"),
            ("chat:a", "chat:a"),
        ] {
            assert!(glob(pattern, name), "{pattern} should match {name}");
        }
        for (pattern, name) in [
            ("chat:*", "news:a"),
            ("chat:?", "chat:ab"),
            ("chat:a", "chat:ab"),
            ("*a", "chat:b"),
            ("[a]", "a"),
        ] {
            assert!(!glob(pattern, name), "{pattern} should not match {name}");
        }
    }
}
