//! Bytes arriving on a RocketMQ connection: frames taken off the buffer by
//! `rokka_remoting::decode` as the server does (length, header word, JSON or
//! ROCKETMQ binary header, body), then every body and field parser a request
//! reaches without a broker: SEND_BATCH_MESSAGE bodies, HEART_BEAT and
//! LOCK/UNLOCK_BATCH_MQ JSON bodies, REGISTER_BROKER (header and body), tag
//! expressions, message properties (keys, delay level, timer delivery) and
//! message ids. Each decoded command must also re-encode to a frame that
//! decodes to the same command. Errors are fine; a panic, an abort or an
//! allocation larger than the bytes justify is a crash.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use rokka_remoting::processor::{parse_heartbeat, parse_lock_batch, split_batch, tag_codes};
use rokka_remoting::{decode, encode, RemotingCommand, DEFAULT_MAX_FRAME};
use rokka_store::record::properties;

/// The property parsers a send reaches (`processor::send_inner`).
fn properties(props: &[u8]) {
    for (k, v) in properties::iter(props) {
        std::hint::black_box((k, v));
    }
    std::hint::black_box(properties::tag_code(props));
    std::hint::black_box(properties::get(props, properties::UNIQ_KEY));
    std::hint::black_box(rokka_broker::schedule::delay_level(props));
    std::hint::black_box(rokka_broker::timer::deliver_at(props, 1_700_000_000_000));
}

fn bodies(cmd: &RemotingCommand) {
    if let Some(parts) = split_batch(&cmd.body) {
        for (_, _, props) in &parts {
            properties(props.as_bytes());
        }
    }
    let _ = parse_heartbeat(&cmd.body);
    let _ = parse_lock_batch(&cmd.body);
    let _ = rokka_remoting::namesrv::wire::from_command(cmd);
    for (_, v) in &cmd.ext_fields.0 {
        std::hint::black_box(tag_codes(v));
        std::hint::black_box(rokka_store::msgid::parse_message_id(v));
        properties(v.as_bytes());
    }
}

fuzz_target!(|data: &[u8]| {
    // Header strings, JSON values and extFields all come from bytes in hand.
    let _budget = rokka_fuzz::budget(data.len(), 1 << 20, 64);
    let mut buf = BytesMut::from(data);
    while let Ok(Some(cmd)) = decode(&mut buf, DEFAULT_MAX_FRAME) {
        bodies(&cmd);
        // What the broker decodes it re-encodes (responses) as the same
        // command.
        let mut out = BytesMut::new();
        encode(&cmd, &mut out);
        match decode(&mut out, DEFAULT_MAX_FRAME) {
            Ok(Some(again)) => assert_eq!(again, cmd, "re-encoded command differs"),
            other => panic!("re-encoded command does not decode: {other:?} from {cmd:?}"),
        }
        assert!(out.is_empty(), "re-encoded frame has {} bytes left over", out.len());
    }
});
