use proptest::prelude::*;

use super::*;
use crate::Cursor;

fn commandish() -> impl Strategy<Value = String> {
    let method = prop_oneof![
        Just("connect"),
        Just("subscribe"),
        Just("unsubscribe"),
        Just("publish"),
        Just("history"),
        Just("ping"),
        Just("x")
    ];
    let value = prop_oneof![
        Just("{}".to_string()),
        Just("null".to_string()),
        Just("[1,{\"a\":2}]".to_string()),
        "[ -~]{0,20}".prop_map(|s| format!("{s:?}")),
        any::<i64>().prop_map(|n| n.to_string()),
    ];
    (
        any::<Option<i64>>(),
        method,
        "[a-z]{0,8}",
        value.clone(),
        value,
    )
        .prop_map(|(id, m, k, v1, v2)| match id {
            Some(id) => format!("{{\"id\":{id},\"{m}\":{{\"channel\":{v1},\"{k}\":{v2}}}}}"),
            None => format!("{{\"{m}\":{{\"{k}\":{v1},\"data\":{v2}}}}}"),
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    /// The decoders are total: any bytes give commands or errors, never a panic.
    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        for _ in decode_frame(&bytes) {}
        let _ = Cursor::parse(&String::from_utf8_lossy(&bytes));
    }

    /// Brackets, quotes and backslashes inside strings never count as nesting, however
    /// they are escaped: only the real depth decides, and only line breaks are dropped.
    #[test]
    fn payload_depth_counts_only_real_nesting(
        depth in 120usize..136,
        leaf in proptest::collection::vec(prop_oneof![
            Just("["), Just("]"), Just("{"), Just("\\"), Just("\""), Just("a"), Just("\n")
        ], 0..12),
        breaks in any::<bool>(),
    ) {
        let leaf = serde_json::to_string(&leaf.concat()).unwrap();
        let gap = if breaks { "\r\n" } else { "" };
        let text = format!("{}{leaf}{gap}{}", "[".repeat(depth), "]".repeat(depth));
        let raw: Box<RawValue> = serde_json::from_str(&text).unwrap();
        match payload(&raw) {
            Ok(kept) => {
                prop_assert!(depth <= MAX_PAYLOAD_DEPTH);
                let expected = text.replace("\r\n", "");
                prop_assert_eq!(&kept[..], expected.as_bytes());
            }
            Err(_) => prop_assert!(depth > MAX_PAYLOAD_DEPTH),
        }
    }

    /// Near-valid commands exercise the paths past JSON parsing.
    #[test]
    fn decoding_near_valid_commands_never_panics(lines in proptest::collection::vec(commandish(), 1..4)) {
        let frame = lines.join("\n");
        for decoded in decode_frame(frame.as_bytes()) {
            if let Ok(Command { method: Method::Publish { data, .. }, .. }) = decoded {
                prop_assert!(serde_json::from_slice::<serde_json::Value>(&data).is_ok());
            }
        }
    }
}
