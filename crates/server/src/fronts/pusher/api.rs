//! Pusher's signed HTTP API, for the app's backend (the `pusher` server SDKs, Laravel's
//! broadcaster): `POST /apps/{id}/events` and `/batch_events`, `GET /apps/{id}/channels`,
//! `/channels/{name}` and `/channels/{name}/users`.
//!
//! Every call is signed with the app's secret: `auth_signature` is the HMAC-SHA256 of
//! `METHOD\nPATH\nQUERY`, QUERY being every other parameter sorted by name
//! (`auth_key`, `auth_timestamp`, `auth_version`, and `body_md5` for a body). A timestamp
//! more than 600 s from the server's clock is refused, so a captured call cannot be
//! replayed later.

use std::sync::Arc;

use axum::{
    body::Bytes,
    extract::{Path, RawQuery, State},
    http::{Method, StatusCode, Uri},
    response::{IntoResponse, Response},
    Json,
};
use herald_protocol::{json, pusher, ChannelName};
use serde::Deserialize;
use serde_json::{json as value, value::RawValue, Map, Value};

use super::sign;
use crate::{admin, config::PusherApp, node::Node, token::unix_now};

/// What a call whose signature is not the app's is told (an unknown app id too).
const BAD_SIGNATURE: &str = "invalid signature: check the app id and its secret";

/// How far a call's `auth_timestamp` may be from the server's clock.
const MAX_SKEW: u64 = 600;

/// Most channels one event goes to (Pusher's limit).
const MAX_CHANNELS: usize = 100;

/// Most events in one batch (Pusher's limit).
const MAX_BATCH: usize = 10;

/// A refusal, as Pusher answers: a status and a line of text.
#[derive(Debug)]
pub struct Refused(StatusCode, String);

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        (self.0, format!("{}\n", self.1)).into_response()
    }
}

fn refused(status: StatusCode, message: impl Into<String>) -> Refused {
    Refused(status, message.into())
}

/// The app `id` names, once the call's signature is checked.
fn signed<'n>(
    node: &'n Node,
    id: &str,
    method: &Method,
    uri: &Uri,
    query: Option<&str>,
    body: &[u8],
) -> Result<&'n PusherApp, Refused> {
    let bad_signature = || refused(StatusCode::UNAUTHORIZED, BAD_SIGNATURE);
    // An unknown app id answers as a bad signature does: a caller without a secret learns
    // nothing of which ids exist.
    let app = node
        .settings
        .config
        .pusher
        .apps
        .iter()
        .find(|a| a.id == id)
        .ok_or_else(bad_signature)?;
    if !app.enabled {
        return Err(refused(StatusCode::FORBIDDEN, "application is disabled"));
    }
    let mut params: Vec<(String, String)> = form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .map(|(k, v)| (k.to_lowercase(), v.into_owned()))
        .collect();
    let get = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let unauthorized = |m: &str| refused(StatusCode::UNAUTHORIZED, m);
    let signature =
        get("auth_signature").ok_or_else(|| unauthorized("auth_signature is missing"))?;
    if get("auth_key").as_deref() != Some(app.key.as_str()) {
        return Err(unauthorized("auth_key is missing or not this app's key"));
    }
    let timestamp: u64 = get("auth_timestamp")
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| unauthorized("auth_timestamp is missing"))?;
    if timestamp.abs_diff(unix_now()) > MAX_SKEW {
        return Err(unauthorized(&format!(
            "auth_timestamp is more than {MAX_SKEW} seconds from the server's time; check the clock"
        )));
    }
    if !body.is_empty() && get("body_md5").as_deref() != Some(sign::md5(body).as_str()) {
        return Err(unauthorized("body_md5 does not match the body"));
    }
    // The signed text joins the parameters decoded, as Pusher's libraries sign them; a
    // `&` in a name or value, or a `=` in a name, would let one parameter be read as two
    // (or two as one) under the same signature, so none is accepted.
    let ambiguous = params
        .iter()
        .any(|(k, v)| k.contains(['&', '=']) || v.contains('&'));
    if ambiguous {
        return Err(unauthorized(
            "a parameter's name or value holds '&' (or its name '='): it cannot be signed unambiguously",
        ));
    }
    params.retain(|(k, _)| k != "auth_signature");
    params.sort();
    let query = params
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&");
    let text = format!("{method}\n{}\n{query}", uri.path());
    if !sign::verify(&app.secret, &text, &signature) {
        return Err(bad_signature());
    }
    Ok(app)
}

/// The Herald channel of Pusher channel `name` in `app`.
fn channel(app: &PusherApp, name: &str) -> Result<ChannelName, Refused> {
    let inside = pusher::inside_name(name).map_err(|e| refused(StatusCode::BAD_REQUEST, e.0))?;
    ChannelName::new(&format!("{}:{inside}", app.namespace()))
        .map_err(|e| refused(StatusCode::BAD_REQUEST, e.to_string()))
}

/// One event as a call gives it.
#[derive(Deserialize)]
struct Event {
    name: String,
    data: Box<RawValue>,
    #[serde(default)]
    channels: Option<Vec<String>>,
    #[serde(default)]
    channel: Option<String>,
    #[serde(default)]
    socket_id: Option<String>,
    #[serde(default)]
    info: Option<String>,
}

/// Publishes `event` to each of its channels; what `info` asked of each.
async fn trigger(
    node: &Node,
    app: &PusherApp,
    event: Event,
) -> Result<Map<String, Value>, Refused> {
    let bad = |m: String| refused(StatusCode::BAD_REQUEST, m);
    let names: Vec<String> = match (event.channels, event.channel) {
        (Some(list), None) => list,
        (None, Some(one)) => vec![one],
        _ => return Err(bad("give channels (a list) or channel".into())),
    };
    if names.is_empty() || names.len() > MAX_CHANNELS {
        return Err(bad(format!(
            "an event goes to 1 to {MAX_CHANNELS} channels"
        )));
    }
    if event.name.is_empty() || event.name.len() > pusher::MAX_EVENT_LEN {
        return Err(bad(format!(
            "event names are 1 to {} characters",
            pusher::MAX_EVENT_LEN
        )));
    }
    if let Some(s) = &event.socket_id {
        let valid = s.split_once('.').is_some_and(|(a, b)| {
            [a, b]
                .iter()
                .all(|p| !p.is_empty() && p.len() <= 20 && p.bytes().all(|c| c.is_ascii_digit()))
        });
        if !valid {
            return Err(bad(format!("invalid socket_id {s:?}")));
        }
    }
    let channels = names
        .iter()
        .map(|n| channel(app, n))
        .collect::<Result<Vec<_>, _>>()?;
    let stored = pusher::stored(&event.name, &event.data, None, event.socket_id.as_deref());
    let stored: &RawValue = serde_json::from_slice(&stored).expect("stored events are JSON");
    let payload = json::payload(stored).map_err(bad)?;
    for channel in &channels {
        crate::publish::publish(node, channel, payload.clone(), None)
            .await
            .map_err(|f| refused(f.status(), f.message))?;
    }
    let mut infos = Map::new();
    if let Some(info) = event.info.as_deref() {
        for (name, channel) in names.iter().zip(&channels) {
            infos.insert(
                name.clone(),
                Value::Object(describe(node, channel, info).await?),
            );
        }
    }
    Ok(infos)
}

/// `POST /apps/{id}/events`.
pub async fn events(
    State(node): State<Arc<Node>>,
    Path(id): Path<String>,
    method: Method,
    uri: Uri,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Result<Response, Refused> {
    let app = signed(&node, &id, &method, &uri, query.as_deref(), &body)?;
    let event: Event = serde_json::from_slice(&body)
        .map_err(|e| refused(StatusCode::BAD_REQUEST, format!("invalid JSON body: {e}")))?;
    let wants_info = event.info.is_some();
    let infos = trigger(&node, app, event).await?;
    Ok(match wants_info {
        true => Json(value!({ "channels": infos })).into_response(),
        false => Json(value!({})).into_response(),
    })
}

/// `POST /apps/{id}/batch_events`.
pub async fn batch_events(
    State(node): State<Arc<Node>>,
    Path(id): Path<String>,
    method: Method,
    uri: Uri,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Result<Response, Refused> {
    #[derive(Deserialize)]
    struct Batch {
        batch: Vec<Event>,
    }
    let app = signed(&node, &id, &method, &uri, query.as_deref(), &body)?;
    let batch: Batch = serde_json::from_slice(&body)
        .map_err(|e| refused(StatusCode::BAD_REQUEST, format!("invalid JSON body: {e}")))?;
    if batch.batch.is_empty() || batch.batch.len() > MAX_BATCH {
        return Err(refused(
            StatusCode::BAD_REQUEST,
            format!("a batch holds 1 to {MAX_BATCH} events"),
        ));
    }
    let mut infos = Vec::new();
    let mut wants_info = false;
    for event in batch.batch {
        wants_info |= event.info.is_some();
        let one = trigger(&node, app, event).await?;
        infos.push(Value::Object(
            one.into_values()
                .next()
                .and_then(|v| v.as_object().cloned())
                .unwrap_or_default(),
        ));
    }
    Ok(match wants_info {
        true => Json(value!({ "batch": infos })).into_response(),
        false => Json(value!({})).into_response(),
    })
}

/// What `info` (`user_count`, `subscription_count`, comma-separated) asks of `channel`.
async fn describe(
    node: &Node,
    channel: &ChannelName,
    info: &str,
) -> Result<Map<String, Value>, Refused> {
    let mut out = Map::new();
    for want in info.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        match want {
            "user_count" => {
                let name = channel.as_str().split_once(':').map_or("", |(_, n)| n);
                if pusher::Kind::of(name) != pusher::Kind::Presence {
                    return Err(refused(
                        StatusCode::BAD_REQUEST,
                        "user_count is only for presence channels",
                    ));
                }
                let stats = node
                    .presence
                    .stats(channel)
                    .await
                    .map_err(|e| refused(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
                out.insert("user_count".into(), stats.users.into());
            }
            "subscription_count" => {
                out.insert(
                    "subscription_count".into(),
                    subscribers(node, channel).await?.into(),
                );
            }
            other => {
                return Err(refused(
                    StatusCode::BAD_REQUEST,
                    format!("unknown info {other:?}: user_count or subscription_count"),
                ))
            }
        }
    }
    Ok(out)
}

/// Occupied channels whose names start with `prefix`, with their subscribers summed over
/// every node; at most `limit`. The server's own channels are left out.
async fn occupied(node: &Node, prefix: &str, limit: usize) -> Result<Vec<(String, u64)>, Refused> {
    let mut found = Vec::new();
    let mut after = String::new();
    loop {
        let action = admin::Action::Channels {
            after: after.clone(),
            prefix: prefix.to_owned(),
            limit: 100,
        };
        let page = admin::everywhere(node, action)
            .await
            .map_err(|f| refused(f.status(), f.message))?;
        let listed = page["channels"].as_array().cloned().unwrap_or_default();
        for c in &listed {
            if let (Some(name), Some(n)) = (c["channel"].as_str(), c["subscribers"].as_u64()) {
                // The server's own channels (users' online status) are no app's.
                if !name.split_once(':').is_some_and(|(_, n)| pusher::hidden(n)) {
                    found.push((name.to_owned(), n));
                }
            }
        }
        match page["cursor"].as_str() {
            Some(cursor) if found.len() < limit && !listed.is_empty() => after = cursor.to_owned(),
            _ => break,
        }
    }
    found.truncate(limit);
    Ok(found)
}

/// Subscribers of `channel` over every node.
async fn subscribers(node: &Node, channel: &ChannelName) -> Result<u64, Refused> {
    let found = occupied(node, channel.as_str(), 100).await?;
    Ok(found
        .iter()
        .find(|(name, _)| name == channel.as_str())
        .map_or(0, |(_, n)| *n))
}

#[derive(Deserialize)]
struct ListParams {
    #[serde(default)]
    filter_by_prefix: Option<String>,
    #[serde(default)]
    info: Option<String>,
}

fn params<T: serde::de::DeserializeOwned>(query: Option<&str>) -> Result<T, Refused> {
    serde_urlencoded(query.unwrap_or(""))
}

fn serde_urlencoded<T: serde::de::DeserializeOwned>(query: &str) -> Result<T, Refused> {
    let pairs: Map<String, Value> = form_urlencoded::parse(query.as_bytes())
        .map(|(k, v)| (k.into_owned(), Value::String(v.into_owned())))
        .collect();
    serde_json::from_value(Value::Object(pairs))
        .map_err(|e| refused(StatusCode::BAD_REQUEST, e.to_string()))
}

/// `GET /apps/{id}/channels[?filter_by_prefix=P][&info=user_count]`.
pub async fn channels(
    State(node): State<Arc<Node>>,
    Path(id): Path<String>,
    method: Method,
    uri: Uri,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, Refused> {
    let app = signed(&node, &id, &method, &uri, query.as_deref(), b"")?;
    let p: ListParams = params(query.as_deref())?;
    let prefix = p.filter_by_prefix.unwrap_or_default();
    if p.info.as_deref().is_some_and(|i| i.contains("user_count"))
        && !prefix.starts_with("presence-")
    {
        return Err(refused(
            StatusCode::BAD_REQUEST,
            "info=user_count needs filter_by_prefix=presence-",
        ));
    }
    let ns = format!("{}:", app.namespace());
    let mut out = Map::new();
    for (name, _) in occupied(&node, &format!("{ns}{prefix}"), 10_000).await? {
        let short = pusher::outside_name(name.strip_prefix(&ns).unwrap_or(&name)).into_owned();
        let info = match p.info.as_deref() {
            Some(info) => {
                let channel = ChannelName::new(&name)
                    .map_err(|e| refused(StatusCode::BAD_REQUEST, e.to_string()))?;
                describe(&node, &channel, info).await?
            }
            None => Map::new(),
        };
        out.insert(short, Value::Object(info));
    }
    Ok(Json(value!({ "channels": out })))
}

/// `GET /apps/{id}/channels/{name}[?info=user_count,subscription_count]`.
pub async fn channel_info(
    State(node): State<Arc<Node>>,
    Path((id, name)): Path<(String, String)>,
    method: Method,
    uri: Uri,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, Refused> {
    let app = signed(&node, &id, &method, &uri, query.as_deref(), b"")?;
    let channel = channel(app, &name)?;
    let p: ListParams = params(query.as_deref())?;
    let mut out = match p.info.as_deref() {
        Some(info) => describe(&node, &channel, info).await?,
        None => Map::new(),
    };
    let count = match out.get("subscription_count") {
        Some(n) => n.as_u64().unwrap_or(0),
        None => subscribers(&node, &channel).await?,
    };
    out.insert("occupied".into(), (count > 0).into());
    Ok(Json(Value::Object(out)))
}

/// `GET /apps/{id}/channels/{name}/users`: a presence channel's users.
pub async fn users(
    State(node): State<Arc<Node>>,
    Path((id, name)): Path<(String, String)>,
    method: Method,
    uri: Uri,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, Refused> {
    let app = signed(&node, &id, &method, &uri, query.as_deref(), b"")?;
    if pusher::Kind::of(&name) != pusher::Kind::Presence {
        return Err(refused(
            StatusCode::BAD_REQUEST,
            "users are listed for presence channels only",
        ));
    }
    let channel = channel(app, &name)?;
    let mut users = std::collections::BTreeSet::new();
    let mut cursor: Option<String> = None;
    loop {
        let (members, next) = node
            .presence
            .page(&channel, cursor.as_deref(), None)
            .await
            .map_err(|f| refused(f.status(), f.message))?;
        for m in &members {
            #[derive(Deserialize)]
            struct Member {
                user: Option<String>,
            }
            if let Some(user) = serde_json::from_slice::<Member>(&m.info)
                .ok()
                .and_then(|m| m.user)
            {
                users.insert(user);
            }
        }
        match next {
            Some(n) => cursor = Some(n),
            None => break,
        }
    }
    let users: Vec<Value> = users.into_iter().map(|id| value!({ "id": id })).collect();
    Ok(Json(value!({ "users": users })))
}

/// `POST /apps/{id}/users/{user}/terminate_connections`: ends every connection the user
/// signed in on (`pusher:signin`), on every node, with 4009 (not to reconnect).
pub async fn terminate(
    State(node): State<Arc<Node>>,
    Path((id, user)): Path<(String, String)>,
    method: Method,
    uri: Uri,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Result<Json<Value>, Refused> {
    let app = signed(&node, &id, &method, &uri, query.as_deref(), &body)?;
    let action = admin::Action::Disconnect {
        who: crate::registry::Who::User(super::speaker::user_key(app, &user)),
        code: pusher::codes::UNAUTHORIZED,
        reason: "connections terminated by the app".into(),
    };
    admin::everywhere(&node, action)
        .await
        .map_err(|f| refused(f.status(), f.message))?;
    Ok(Json(value!({})))
}
