//! The `node-message` target: what one node reads from another through Redis, other than
//! publications. A message on the node's own channel (a probe, another node's request, an
//! answer to one of its own), the requests themselves as the node answers them (an
//! operator's action carried out here, a send for one of its sessions), and a presence
//! batch as another node announces it (pushed to this node's subscribers).

use std::sync::Arc;

use bytes::Bytes;
use herald_broker::{NodeRequests, PresenceEvents};
use herald_broker_redis::{decode_node_message, NodeMessage};
use herald_server::{
    admin::{Action, NODE_REQUEST},
    registry::Who,
    Config, Node,
};

use crate::decoder::{runtime, Decoder};

/// Valid messages of every kind.
pub fn corpus() -> Vec<Vec<u8>> {
    let action = |a: &Action| {
        let mut request = NODE_REQUEST.to_vec();
        request.extend(serde_json::to_vec(a).expect("actions serialise"));
        request
    };
    let actions = [
        Action::Channels {
            after: String::new(),
            prefix: "chat:".into(),
            limit: 10,
        },
        Action::Disconnect {
            who: Who::User("7".into()),
            code: 3000,
            reason: "fuzz".into(),
        },
    ];
    let mut out: Vec<Vec<u8>> = actions.iter().map(action).collect();
    for request in out.clone() {
        let mut asked = b"qnode-b\n42\n".to_vec();
        asked.extend(request);
        out.push(asked);
    }
    out.extend(
        [
            "t17",
            "r42\n{\"channels\":[{\"channel\":\"chat:a\",\"subscribers\":3}]}",
            "abc123-session\n{\"id\":1,\"publish\":{\"channel\":\"chat:a\",\"data\":1}}",
            "room:a\n{\"presence\":{\"channel\":\"room:a\",\"join\":[{\"id\":\"00000000000000ff\",\"info\":{\"user\":\"7\"}}],\"leave\":[]}}\n",
        ]
        .iter()
        .map(|t| t.as_bytes().to_vec()),
    );
    out
}

/// Each input as a message on the node's channel, as a request the node answers, and as a
/// presence batch.
pub fn decoder() -> Decoder {
    let rt = runtime();
    let node: Arc<Node> = {
        let _inside = rt.enter();
        let settings = Config::default()
            .validate()
            .expect("the defaults are valid");
        Node::with_memory_broker(settings)
    };
    Box::new(move |input| {
        rt.block_on(async {
            if let Some(NodeMessage::Request { request, .. }) = decode_node_message(input) {
                let _ = node.answer(Bytes::copy_from_slice(request)).await;
            }
            let _ = node.answer(Bytes::copy_from_slice(input)).await;
        });
        PresenceEvents::heard(&*node.presence, Bytes::copy_from_slice(input));
    })
}
