//! Each rule of RFC 6455 §5 and RFC 7692 the reader enforces, one test or more each.

use super::*;

const MASK: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];

/// A client's frame: masked, as RFC 6455 §5.3 requires.
fn client(fin: bool, rsv1: bool, op: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    write_client_frame(&mut out, (fin, rsv1, op), payload, MASK);
    out
}

fn reader() -> Reader {
    Reader::new(1000, true)
}

fn read_all(r: &mut Reader, mut buf: Vec<u8>) -> Result<Vec<Incoming>, Violation> {
    let mut got = Vec::new();
    while let Some(i) = r.read(&mut buf)? {
        got.push(i);
    }
    assert!(buf.is_empty(), "left unread: {buf:?}");
    Ok(got)
}

fn text(s: &str) -> Incoming {
    Incoming::Text(Bytes::copy_from_slice(s.as_bytes()))
}

#[test]
fn the_rfc_examples_read_as_the_rfc_says() {
    // RFC 6455 §5.7: a single-frame masked text message "Hello".
    let hello = [
        0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58,
    ];
    assert_eq!(
        read_all(&mut reader(), hello.to_vec()),
        Ok(vec![text("Hello")])
    );
    // RFC 7692 §7.2.3.1: "Hello" compressed, masked by us.
    let compressed = client(
        true,
        true,
        opcode::TEXT,
        &[0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00],
    );
    assert_eq!(read_all(&mut reader(), compressed), Ok(vec![text("Hello")]));
}

#[test]
fn a_frame_arriving_a_byte_at_a_time_is_read_once_whole() {
    let frames = [
        client(true, false, opcode::TEXT, &[b'a'; 300]),
        client(true, false, opcode::BINARY, &[1; 70_000][..900]),
        client(true, false, opcode::PING, b"p"),
    ]
    .concat();
    let mut r = reader();
    let (mut buf, mut got) = (Vec::new(), Vec::new());
    for b in frames {
        assert!(r.wants(&buf) >= 1);
        buf.push(b);
        if let Some(i) = r.read(&mut buf).unwrap() {
            got.push(i);
        }
    }
    assert_eq!(got.len(), 3);
    assert!(buf.is_empty());
    assert_eq!(got[2], Incoming::Ping(Bytes::from_static(b"p")));
}

#[test]
fn frames_read_from_a_buffer_the_caller_keeps_appending_to_come_in_order() {
    let frames = [
        client(true, false, opcode::TEXT, b"one"),
        client(true, false, opcode::TEXT, b"two"),
        client(true, false, opcode::TEXT, &[b'3'; 300]),
    ];
    let (third, cut) = (&frames[2], frames[2].len() / 2);
    let mut r = reader();
    // Two whole frames and half the third, in one read.
    let mut buf = [&frames[0][..], &frames[1][..], &third[..cut]].concat();
    assert_eq!(r.read(&mut buf), Ok(Some(text("one"))));
    assert_eq!(r.wants(&buf), 1, "the next frame is whole");
    assert_eq!(r.read(&mut buf), Ok(Some(text("two"))));
    assert_eq!(r.wants(&buf), third.len() - cut);
    assert_eq!(r.read(&mut buf), Ok(None));
    // What was taken is gone once more is needed: only the third's first half is left.
    assert_eq!(buf, third[..cut]);
    buf.extend_from_slice(&third[cut..]);
    assert_eq!(r.read(&mut buf), Ok(Some(text(&"3".repeat(300)))));
    assert!(buf.is_empty());
}

#[test]
fn wants_says_how_much_of_a_large_frame_is_missing() {
    let frame = client(true, false, opcode::TEXT, &[b'a'; 900]);
    let r = reader();
    assert_eq!(r.wants(&frame[..8]), frame.len() - 8);
    assert_eq!(r.wants(&[]), 1);
}

#[test]
fn unmasked_client_frames_are_refused() {
    let mut plain = Vec::new();
    write_frame(&mut plain, true, false, opcode::TEXT, b"hi");
    assert!(matches!(
        reader().read(&mut plain),
        Err(Violation::Protocol(_))
    ));
}

#[test]
fn reserved_bits_and_opcodes_are_refused() {
    let mut rsv2 = client(true, false, opcode::TEXT, b"x");
    rsv2[0] |= 0x20;
    let mut rsv3 = client(true, false, opcode::TEXT, b"x");
    rsv3[0] |= 0x10;
    for bad in [
        rsv2,
        rsv3,
        client(true, false, 0x3, b""),
        client(true, false, 0x7, b""),
        client(true, false, 0xB, b""),
        client(true, false, 0xF, b""),
    ] {
        let mut buf = bad.clone();
        assert!(
            matches!(reader().read(&mut buf), Err(Violation::Protocol(_))),
            "{bad:?}"
        );
    }
}

#[test]
fn rsv1_needs_deflate_and_a_data_messages_first_frame() {
    let compressed = compress_hello();
    // Without deflate negotiated.
    let mut buf = client(true, true, opcode::TEXT, &compressed);
    assert!(matches!(
        Reader::new(1000, false).read(&mut buf),
        Err(Violation::Protocol(_))
    ));
    // On a control frame.
    let mut buf = client(true, true, opcode::PING, b"");
    assert!(matches!(
        reader().read(&mut buf),
        Err(Violation::Protocol(_))
    ));
    // On a continuation frame.
    let buf = [
        client(false, false, opcode::TEXT, b"a"),
        client(true, true, opcode::CONTINUATION, b"b"),
    ]
    .concat();
    assert!(matches!(
        read_all(&mut reader(), buf),
        Err(Violation::Protocol(_))
    ));
}

fn compress_hello() -> Vec<u8> {
    super::deflate::compress(b"Hello")
}

#[test]
fn control_frames_are_short_and_final() {
    let mut long_ping = client(true, false, opcode::PING, &[0; 126]);
    assert!(matches!(
        reader().read(&mut long_ping),
        Err(Violation::Protocol(_))
    ));
    let mut max_ping = client(true, false, opcode::PING, &[0; 125]);
    assert!(matches!(reader().read(&mut max_ping), Ok(Some(Incoming::Ping(p))) if p.len() == 125));
    let mut fragmented_ping = client(false, false, opcode::PING, b"");
    assert!(matches!(
        reader().read(&mut fragmented_ping),
        Err(Violation::Protocol(_))
    ));
}

#[test]
fn fragments_join_with_control_frames_between() {
    let buf = [
        client(false, false, opcode::TEXT, b"fra"),
        client(true, false, opcode::PING, b"1"),
        client(false, false, opcode::CONTINUATION, b"gme"),
        client(true, false, opcode::PONG, b""),
        client(true, false, opcode::CONTINUATION, b"nted"),
    ]
    .concat();
    assert_eq!(
        read_all(&mut reader(), buf),
        Ok(vec![
            Incoming::Ping(Bytes::from_static(b"1")),
            Incoming::Pong(Bytes::new()),
            text("fragmented"),
        ])
    );
}

#[test]
fn a_compressed_message_may_come_in_fragments() {
    let compressed = super::deflate::compress("fragmented and compressed".repeat(5).as_bytes());
    let (a, b) = compressed.split_at(compressed.len() / 2);
    let buf = [
        client(false, true, opcode::TEXT, a),
        client(true, false, opcode::CONTINUATION, b),
    ]
    .concat();
    assert_eq!(
        read_all(&mut reader(), buf),
        Ok(vec![text(&"fragmented and compressed".repeat(5))])
    );
}

#[test]
fn continuation_only_inside_a_message_and_messages_do_not_nest() {
    let stray = client(true, false, opcode::CONTINUATION, b"x");
    assert!(matches!(
        read_all(&mut reader(), stray),
        Err(Violation::Protocol(_))
    ));
    let nested = [
        client(false, false, opcode::TEXT, b"a"),
        client(true, false, opcode::TEXT, b"b"),
    ]
    .concat();
    assert!(matches!(
        read_all(&mut reader(), nested),
        Err(Violation::Protocol(_))
    ));
}

#[test]
fn a_message_over_the_limit_is_refused_from_its_header() {
    // Only the header of a 2 GB frame: refused without waiting for its bytes.
    let mut header = vec![0x81, 0xFF];
    header.extend_from_slice(&(2u64 << 30).to_be_bytes());
    assert_eq!(
        reader().read(&mut header),
        Err(Violation::TooLarge {
            size: 2 << 30,
            limit: 1000
        })
    );
    // Fragments that pass the limit together.
    let buf = [
        client(false, false, opcode::BINARY, &[0; 600]),
        client(true, false, opcode::CONTINUATION, &[0; 600]),
    ]
    .concat();
    assert_eq!(
        read_all(&mut reader(), buf),
        Err(Violation::TooLarge {
            size: 1200,
            limit: 1000
        })
    );
    // A length with its top bit set.
    let mut huge = vec![0x82, 0xFF];
    huge.extend_from_slice(&u64::MAX.to_be_bytes());
    assert!(matches!(
        reader().read(&mut huge),
        Err(Violation::Protocol(_))
    ));
    // Exactly the limit is fine.
    let exact = client(true, false, opcode::BINARY, &[0; 1000]);
    assert_eq!(read_all(&mut reader(), exact).unwrap().len(), 1);
}

#[test]
fn a_compressed_bomb_is_refused_at_the_inflate_limit() {
    let bomb = super::deflate::compress(&vec![b'a'; 200_000]);
    assert!(bomb.len() < 1000);
    let buf = client(true, true, opcode::TEXT, &bomb);
    assert_eq!(
        read_all(&mut reader(), buf),
        Err(Violation::InflatesTooLarge { limit: 1000 })
    );
}

#[test]
fn text_must_be_utf8_binary_need_not() {
    let bad = client(true, false, opcode::TEXT, &[0xce, 0xba, 0xe1, 0xbd]);
    assert_eq!(read_all(&mut reader(), bad), Err(Violation::NotUtf8));
    // A character split across fragments is fine: the message is checked whole.
    let split = [
        client(false, false, opcode::TEXT, &[0xce]),
        client(true, false, opcode::CONTINUATION, &[0xba]),
    ]
    .concat();
    assert_eq!(read_all(&mut reader(), split), Ok(vec![text("κ")]));
    let binary = client(true, false, opcode::BINARY, &[0xff, 0xfe]);
    assert_eq!(
        read_all(&mut reader(), binary),
        Ok(vec![Incoming::Binary(Bytes::from_static(&[0xff, 0xfe]))])
    );
}

#[test]
fn close_frames_carry_a_valid_code_and_a_utf8_reason() {
    let close =
        |payload: &[u8]| read_all(&mut reader(), client(true, false, opcode::CLOSE, payload));
    assert_eq!(close(b""), Ok(vec![Incoming::Close(None)]));
    assert_eq!(
        close(&[0x03, 0xe8, b'b', b'y', b'e']),
        Ok(vec![Incoming::Close(Some((1000, "bye".into())))])
    );
    assert!(matches!(close(&[0x03]), Err(Violation::Protocol(_))));
    assert_eq!(close(&[0x03, 0xe8, 0xff]), Err(Violation::NotUtf8));
    for code in [0u16, 999, 1004, 1005, 1006, 1015, 1016, 2999, 5000, 65535] {
        assert!(
            matches!(close(&code.to_be_bytes()), Err(Violation::Protocol(_))),
            "{code}"
        );
    }
    for code in [
        1000u16, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 3000, 4999,
    ] {
        assert!(close(&code.to_be_bytes()).is_ok(), "{code}");
    }
}

#[test]
fn written_frames_match_the_rfc_and_tungstenite() {
    use tungstenite::protocol::frame::{coding::OpCode, Frame};
    for size in [0, 125, 126, 65_535, 65_536] {
        let payload = vec![b'x'; size];
        let mut theirs = Vec::new();
        Frame::message(
            payload.clone(),
            OpCode::Data(tungstenite::protocol::frame::coding::Data::Text),
            true,
        )
        .format(&mut theirs)
        .unwrap();
        let mut ours = Vec::new();
        write_frame(&mut ours, true, false, opcode::TEXT, &payload);
        assert_eq!(ours, theirs, "size {size}");
    }
    // RFC 7692 §7.2.3.1: a compressed "Hello" is c1 07 then the payload.
    let mut ours = Vec::new();
    write_frame(&mut ours, true, true, opcode::TEXT, &compress_hello());
    assert_eq!(ours[..2], [0xc1, 0x07]);
}
