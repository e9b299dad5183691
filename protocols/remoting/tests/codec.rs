//! Codec tests: the digest's worked example byte for byte, golden frames
//! captured from a real client (rocketmq-client-rust 1.0.0) and its broker in
//! both directions, round trips, and malformed input.

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use rokka_remoting::*;

mod reference;
use reference::reference_json;

/// Bytes from hex digits; an odd length or a non-hex digit is a bug in the
/// test (or a damaged golden file), never something to skip.
fn hex(s: &str) -> Vec<u8> {
    assert!(
        s.len().is_multiple_of(2),
        "odd number of hex digits ({}) in {s:?}",
        s.len()
    );
    s.as_bytes()
        .chunks(2)
        .enumerate()
        .map(|(i, pair)| {
            let digit = |c: &u8| char::from(*c).to_digit(16);
            match (pair.first().and_then(digit), pair.get(1).and_then(digit)) {
                (Some(hi), Some(lo)) => (hi * 16 + lo) as u8,
                _ => panic!("invalid hex digits {pair:?} at offset {} in {s:?}", 2 * i),
            }
        })
        .collect()
}

#[test]
fn hex_helper_refuses_bad_digits() {
    assert_eq!(hex("00ff7A"), vec![0x00, 0xff, 0x7a]);
    for bad in ["0", "zz", "0g", "00 1", "+1", "-1", "é"] {
        assert!(
            std::panic::catch_unwind(|| hex(bad)).is_err(),
            "hex({bad:?}) must panic"
        );
    }
}

fn one(bytes: &[u8]) -> RemotingCommand {
    let mut b = BytesMut::from(bytes);
    let cmd = decode(&mut b, DEFAULT_MAX_FRAME)
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("incomplete"));
    assert!(b.is_empty(), "whole frame consumed");
    cmd
}

#[test]
fn worked_example_binary_and_json() {
    let mut cmd = RemotingCommand::request(codes::request::GET_ROUTEINFO_BY_TOPIC, 1);
    cmd.version = 401;
    cmd.serialize_type = SerializeType::RocketMq;
    cmd.ext_fields.set("topic", "T");
    let mut out = BytesMut::new();
    encode(&cmd, &mut out);
    // The digest's table, concatenated.
    let want_fixed = hex(concat!(
        "00000025",
        "01000021",
        "0069",
        "00",
        "0191",
        "00000001",
        "00000000",
        "00000000",
        "0000000c",
        "0005746f706963",
        "0000000154"
    ));
    assert_eq!(out.to_vec(), want_fixed);
    assert_eq!(one(&out), cmd);

    cmd.serialize_type = SerializeType::Json;
    let mut out = BytesMut::new();
    encode(&cmd, &mut out);
    let header = r#"{"code":105,"extFields":{"topic":"T"},"flag":0,"language":"JAVA","opaque":1,"serializeTypeCurrentRPC":"JSON","version":401}"#;
    assert_eq!(header.len(), 123);
    assert_eq!(&out[..8], &hex("0000007f0000007b")[..]);
    assert_eq!(&out[8..], header.as_bytes());
    let back = one(&out);
    assert_eq!(back.ext_fields.get("topic"), Some("T"));
    assert_eq!(back.version, 401);
}

#[test]
fn golden_frames_from_a_real_client_decode_and_reencode() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden");
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{e}")) {
        let path = entry.unwrap_or_else(|e| panic!("{e}")).path();
        if path.extension().and_then(|e| e.to_str()) != Some("hex") {
            continue;
        }
        let name = path
            .file_name()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_string();
        let bytes = hex(std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}")).trim());
        let cmd = one(&bytes);
        // File names say <capture>-<req|resp>-<code>-<json|bin>.
        let parts: Vec<&str> = name.trim_end_matches(".hex").rsplitn(4, '-').collect();
        let (st, code, dir) = (parts[0], parts[1], parts[2]);
        assert_eq!(cmd.code.to_string(), code, "{name}");
        assert_eq!(cmd.serialize_type == SerializeType::RocketMq, st == "bin", "{name}");
        assert_eq!(cmd.is_response(), dir == "resp", "{name}");
        // Re-encoding: binary headers byte for byte; JSON headers to an
        // equal command (key order and escapes are the writer's choice).
        let mut out = BytesMut::new();
        encode(&cmd, &mut out);
        if cmd.serialize_type == SerializeType::RocketMq {
            assert_eq!(out.to_vec(), bytes, "{name}");
        }
        assert_eq!(one(&out), cmd, "{name}");
        n += 1;
    }
    assert!(n >= 80, "golden frames found: {n}");
}

#[test]
fn golden_send_message_fields() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/golden/rust_producer_sync-req-10-json.hex"
    );
    let cmd = one(&hex(std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{e}"))
        .trim()));
    assert_eq!(cmd.code, codes::request::SEND_MESSAGE);
    for key in ["producerGroup", "topic", "queueId", "properties", "bornTimestamp"] {
        assert!(cmd.ext_fields.get(key).is_some(), "{key}");
    }
    assert!(!cmd.body.is_empty());
    let props = cmd.ext_fields.get("properties").unwrap_or_default();
    assert!(
        props.contains('\u{1}') && props.contains('\u{2}'),
        "control characters survive JSON"
    );
}

#[test]
fn lenient_json_headers() {
    // C++-core clients: numbers for strings, no serializeTypeCurrentRPC, a
    // trailing newline, unknown keys, an unknown language.
    let h = "{\"code\":\"310\",\"language\":\"LUA\",\"opaque\":7,\"flag\":2,\"version\":\"401\",\"extFields\":{\"a\":\"g\",\"d\":4,\"k\":false,\"n\":null},\"x\":[1]}\n";
    let mut f = BytesMut::new();
    f.extend_from_slice(&((4 + h.len()) as u32).to_be_bytes());
    f.extend_from_slice(&(h.len() as u32).to_be_bytes());
    f.extend_from_slice(h.as_bytes());
    let cmd = one(&f);
    assert_eq!((cmd.code, cmd.opaque, cmd.version), (310, 7, 401));
    assert!(cmd.is_oneway());
    assert_eq!(cmd.language, LanguageCode::Other);
    assert_eq!(cmd.ext_fields.get("d"), Some("4"));
    assert_eq!(cmd.ext_fields.get("k"), Some("false"));
    assert_eq!(cmd.ext_fields.get("n"), None);
}

#[test]
fn partial_frames_wait_and_bad_frames_are_errors() {
    let mut cmd = RemotingCommand::request(34, 9);
    cmd.body = Bytes::from_static(b"{\"clientID\":\"x\"}");
    let mut full = BytesMut::new();
    encode(&cmd, &mut full);
    encode(&cmd, &mut full);
    // Any prefix of the first frame: incomplete, nothing consumed.
    let one_len = full.len() / 2;
    for cut in 0..one_len {
        let mut b = BytesMut::from(&full[..cut]);
        assert_eq!(decode(&mut b, DEFAULT_MAX_FRAME), Ok(None));
        assert_eq!(b.len(), cut);
    }
    // Two frames back to back come out one at a time.
    let mut b = full.clone();
    assert!(decode(&mut b, DEFAULT_MAX_FRAME).ok().flatten().is_some());
    assert_eq!(
        decode(&mut b, DEFAULT_MAX_FRAME).ok().flatten().map(|c| c.opaque),
        Some(9)
    );
    assert!(b.is_empty());
    // Oversized, a header past the end, garbage headers.
    let mut b = BytesMut::from(&hex("7fffffff00000000")[..]);
    assert!(matches!(
        decode(&mut b, DEFAULT_MAX_FRAME),
        Err(FrameError::TooLarge { .. })
    ));
    let mut b = BytesMut::from(&hex("00000008000000ff00000000")[..]);
    assert!(matches!(
        decode(&mut b, DEFAULT_MAX_FRAME),
        Err(FrameError::HeaderPastEnd { .. })
    ));
    // A JSON header (serialize type 0) that is not JSON ("zz"), JSON that is
    // not an object ("[]"), an object without a code ("{}"): BadHeader, and
    // the whole frame is taken off the buffer (the connection then closes).
    for (frame, why) in [
        ("00000006000000027a7a", "JSON header: "),
        ("00000006000000025b5d", "JSON header is not an object"),
        ("00000006000000027b7d", "JSON header without a code"),
    ] {
        let mut b = BytesMut::from(&hex(frame)[..]);
        b.extend_from_slice(&hex("00000004"));
        match decode(&mut b, DEFAULT_MAX_FRAME) {
            Err(FrameError::BadHeader(m)) => assert!(m.starts_with(why), "{frame}: {m}"),
            other => panic!("{frame}: want BadHeader({why}...), got {other:?}"),
        }
        assert_eq!(
            &b[..],
            &hex("00000004")[..],
            "{frame}: exactly the bad frame is consumed"
        );
    }
    // Binary headers (serialize type 1) cut short inside the code, and with a
    // remark length running past the header.
    let mut b = BytesMut::from(&hex("0000000501000001ff")[..]);
    assert_eq!(
        decode(&mut b, DEFAULT_MAX_FRAME),
        Err(FrameError::BadHeader("binary header truncated in code".into()))
    );
    let mut b = BytesMut::from(
        &hex(concat!(
            "00000016", "01000012", "0022", "00", "0191", "00000001", "00000000", "00000005", "00"
        ))[..],
    );
    assert_eq!(
        decode(&mut b, DEFAULT_MAX_FRAME),
        Err(FrameError::BadHeader("binary header truncated in remark".into()))
    );
    let mut b = BytesMut::from(&hex("00000006020000000000")[..]);
    assert!(matches!(
        decode(&mut b, DEFAULT_MAX_FRAME),
        Err(FrameError::UnknownSerializeType(2))
    ));
}

fn command() -> impl Strategy<Value = RemotingCommand> {
    (
        any::<i16>(),
        0u8..14,
        any::<i16>(),
        any::<i32>(),
        0i32..4,
        proptest::option::of("[ -~]{1,20}"),
        prop::collection::vec(("[a-zA-Z]{1,8}", "[\\x01\\x02 -~é]{0,12}"), 0..6),
        prop::collection::vec(any::<u8>(), 0..64),
        any::<bool>(),
    )
        .prop_map(|(code, lang, version, opaque, flag, remark, ext, body, binary)| {
            let mut e = ExtFields::default();
            for (k, v) in ext {
                // Binary headers read an empty value as empty, JSON too; keys unique.
                e.set(&k, v);
            }
            RemotingCommand {
                code: i32::from(code),
                language: LanguageCode::from_code(lang),
                version: i32::from(version),
                opaque,
                flag,
                remark,
                ext_fields: e,
                serialize_type: if binary {
                    SerializeType::RocketMq
                } else {
                    SerializeType::Json
                },
                body: Bytes::from(body),
            }
        })
}

proptest! {
    #[test]
    fn round_trip(cmd in command()) {
        let mut out = BytesMut::new();
        encode(&cmd, &mut out);
        let mut json_sorted = cmd.clone();
        if cmd.serialize_type == SerializeType::Json {
            // JSON objects come back in key order.
            json_sorted.ext_fields.0.sort();
        }
        let mut back = one(&out);
        if cmd.serialize_type == SerializeType::Json {
            back.ext_fields.0.sort();
        }
        prop_assert_eq!(back, json_sorted);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let mut b = BytesMut::from(&bytes[..]);
        let _ = decode(&mut b, 1024);
    }
}

/// A JSON value's text of the kinds headers carry (and some they should not).
fn json_value() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9 \\\\é]{0,8}".prop_map(|s| serde_json::to_string(&s).unwrap_or_default()),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
        (-1e6f64..1e6).prop_map(|f| format!("{f:?}")),
        Just("1.0".to_string()),
        Just("true".to_string()),
        Just("null".to_string()),
        Just("\"12\"".to_string()),
        Just("{\"x\":[1,{\"y\":null}]}".to_string()),
        Just("[1,\"a\"]".to_string()),
    ]
}

/// Header text: top-level keys (the known ones, repeats, others) with any
/// values, extFields an object of short keys (repeats likely) or not one.
fn json_header() -> impl Strategy<Value = String> {
    let ext_pair = ("[a-d]{1,2}", json_value()).prop_map(|(k, v)| format!("\"{k}\":{v}"));
    let ext = prop_oneof![
        4 => prop::collection::vec(ext_pair, 0..8).prop_map(|p| format!("{{{}}}", p.join(","))),
        1 => json_value(),
    ];
    let key = prop_oneof![
        Just("code"),
        Just("language"),
        Just("version"),
        Just("opaque"),
        Just("flag"),
        Just("remark"),
        Just("other"),
        Just("serializeTypeCurrentRPC"),
    ];
    let top_pair = (key, json_value()).prop_map(|(k, v)| format!("\"{k}\":{v}"));
    (
        prop::collection::vec(top_pair, 0..8),
        prop::option::of(ext),
        any::<bool>(),
    )
        .prop_map(|(mut pairs, ext, code_first)| {
            if code_first {
                pairs.insert(0, "\"code\":310".to_string());
            }
            if let Some(e) = ext {
                pairs.push(format!("\"extFields\":{e}"));
            }
            format!("{{{}}}", pairs.join(","))
        })
}

proptest! {
    #[test]
    fn the_one_pass_json_decoder_reads_what_the_value_decoder_read(
        header in prop_oneof![9 => json_header(), 1 => json_value()]
    ) {
        let h = header.as_bytes();
        let mut frame = BytesMut::new();
        frame.extend_from_slice(&((4 + h.len()) as u32).to_be_bytes());
        frame.extend_from_slice(&(h.len() as u32).to_be_bytes());
        frame.extend_from_slice(h);
        let got = decode(&mut frame, DEFAULT_MAX_FRAME).ok().flatten();
        prop_assert_eq!(got, reference_json(h), "{}", header);
    }
}
