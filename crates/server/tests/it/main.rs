//! Integration tests: a real server on 127.0.0.1 and a free port, real clients.

mod support;

mod access;
mod admin;
mod api;
mod auth;
mod auth_keys;
mod behaviour;
mod centrifugo;
mod conflation;
mod cross;
mod dashboard;
mod delta;
mod errors;
mod hook_events;
mod hook_failures;
mod hooks;
mod hostile;
mod http;
mod idempotency;
mod lean;
mod lean_publish;
mod lifecycle;
mod limits;
mod longpoll;
mod longpoll_lane;
mod metrics;
mod nodes;
mod ordering;
mod phoenix;

mod presence;
mod protobuf;
mod pusher_hostile;
mod readiness;
mod replies;
mod resume;
mod rules;
mod storage;
mod web;
mod websocket;
