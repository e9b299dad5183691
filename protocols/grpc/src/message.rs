//! apache.rocketmq.v2 messages ↔ stored RocketMQ messages. A gRPC message
//! is stored as a remoting producer would store it (docs/rocketmq5.md has
//! the table), so remoting and Kafka consumers read it as any other.

use std::io::Read;
use std::net::{IpAddr, SocketAddr};

use rokka_store::record::message::MessageView;
use rokka_store::record::properties;

use crate::pb;

/// RocketMQ's property of a FIFO message's group (`MessageConst.PROPERTY_SHARDING_KEY`).
pub const SHARDING_KEY: &str = "__SHARDINGKEY";
/// A transactional message's half flag.
pub const TRAN_MSG: &str = "TRAN_MSG";
/// Where a dead letter came from (Apache's `DLQ_ORIGIN_TOPIC`, `DLQ_ORIGIN_MESSAGE_ID`).
pub const DLQ_ORIGIN_TOPIC: &str = "DLQ_ORIGIN_TOPIC";
pub const DLQ_ORIGIN_MESSAGE_ID: &str = "DLQ_ORIGIN_MESSAGE_ID";
/// A message's trace context (RocketMQ 5 `TRACE_CONTEXT`).
pub const TRACE_CONTEXT: &str = "TRACE_CONTEXT";

/// Why a message from a producer was refused: the status code and text.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused(pub pb::Code, pub String);

/// A producer's message, ready to be stored.
#[derive(Debug)]
pub struct Incoming {
    pub topic: String,
    pub body: bytes::Bytes,
    pub properties: String,
    pub message_id: String,
    pub born_timestamp_ms: i64,
    pub born_host: Option<IpAddr>,
    pub message_group: Option<String>,
    pub deliver_at_ms: Option<i64>,
    pub transactional: bool,
}

fn legal_property(k: &str, v: &str) -> bool {
    let bad = |s: &str| {
        s.bytes()
            .any(|b| b == properties::NAME_VALUE_SEPARATOR || b == properties::PROPERTY_SEPARATOR)
    };
    !k.is_empty() && !bad(k) && !bad(v)
}

/// What one message of a SendMessage may carry (`grpc.max_*` keys).
#[derive(Debug, Clone, Copy)]
pub struct SendLimits {
    pub max_body: usize,
    pub max_user_properties: usize,
    pub max_user_property_bytes: usize,
    pub max_message_group_bytes: usize,
}

impl SendLimits {
    pub fn of(c: &crate::GrpcConfig) -> SendLimits {
        // 0: no limit, as in Apache's proxy config these keys mirror.
        let limit = |v: u32| if v == 0 { usize::MAX } else { v as usize };
        SendLimits {
            max_body: c.max_body_bytes as usize,
            max_user_properties: limit(c.max_user_properties),
            max_user_property_bytes: limit(c.max_user_property_bytes),
            max_message_group_bytes: limit(c.max_message_group_bytes),
        }
    }
}

/// Checks and converts one message of a SendMessage.
pub fn incoming(m: &pb::Message, limits: &SendLimits) -> Result<Incoming, Refused> {
    let max_body = limits.max_body;
    let topic = m.topic.as_ref().map(|t| t.name.clone()).unwrap_or_default();
    if topic.is_empty() {
        return Err(Refused(pb::Code::IllegalTopic, "topic is required".into()));
    }
    let sys = m.system_properties.clone().unwrap_or_default();
    let body = match sys.body_encoding() {
        pb::Encoding::Gzip => {
            let mut out = Vec::new();
            let mut d = flate2::read::GzDecoder::new(&m.body[..]).take(max_body as u64 + 1);
            if d.read_to_end(&mut out).is_err() {
                return Err(Refused(pb::Code::MessageCorrupted, "body is not gzip".into()));
            }
            bytes::Bytes::from(out)
        }
        _ => m.body.clone(),
    };
    if body.is_empty() {
        return Err(Refused(pb::Code::MessageBodyEmpty, "message body is empty".into()));
    }
    if body.len() > max_body {
        return Err(Refused(
            pb::Code::MessageBodyTooLarge,
            format!("message body of {} bytes is over the limit of {max_body}", body.len()),
        ));
    }
    // As Apache's proxy (SendMessageActivity.buildMessageProperty,
    // GrpcValidator): at most so many user properties, no control
    // character in them, their bytes with the tag's and keys' at most so
    // many — a producer that works here works there.
    if m.user_properties.len() > limits.max_user_properties {
        return Err(Refused(
            pb::Code::MessagePropertiesTooLarge,
            format!("too many user properties, max is {}", limits.max_user_properties),
        ));
    }
    let control = |s: &str| s.chars().any(char::is_control);
    let mut user_bytes = 0usize;
    let mut pairs: Vec<(String, String)> = Vec::new();
    for (k, v) in &m.user_properties {
        if !legal_property(k, v) || rokka_broker::convert::SYSTEM_PROPERTIES.contains(&k.as_str()) {
            return Err(Refused(
                pb::Code::IllegalMessagePropertyKey,
                format!("user property {k:?} is reserved or holds a separator byte"),
            ));
        }
        if control(k) || control(v) {
            return Err(Refused(
                pb::Code::IllegalMessagePropertyKey,
                format!("user property {k:?} holds a control character"),
            ));
        }
        user_bytes += k.len() + v.len();
        pairs.push((k.clone(), v.clone()));
    }
    // Stable order for the stored block (a map has none).
    pairs.sort();
    if let Some(tag) = sys.tag.as_deref().filter(|t| !t.is_empty()) {
        // No `|` (a tag expression splits on `||`: "a|b" matched neither
        // a nor b), not whitespace only (a filter of spaces means `*`), no
        // control character: Apache's GrpcValidator.validateTag.
        if !legal_property("TAGS", tag) || tag.contains('|') || tag.trim().is_empty() || control(tag) {
            return Err(Refused(pb::Code::IllegalMessageTag, format!("illegal tag {tag:?}")));
        }
        user_bytes += tag.len();
        pairs.push((properties::TAGS.into(), tag.to_string()));
    }
    if !sys.keys.is_empty() {
        // As Apache's proxy (SendMessageActivity.validateMessageKey): a
        // key may hold spaces (the stored KEYS property is space-separated,
        // so such a key is indexed as its words, as there), but not be all
        // whitespace or hold a control character.
        if let Some(k) = sys
            .keys
            .iter()
            .find(|k| (!k.is_empty() && k.trim().is_empty()) || k.chars().any(char::is_control))
        {
            return Err(Refused(
                pb::Code::IllegalMessageKey,
                format!("key {k:?} is whitespace only or holds a control character"),
            ));
        }
        user_bytes += sys.keys.iter().map(String::len).sum::<usize>();
        pairs.push((properties::KEYS.into(), sys.keys.join(" ")));
    }
    if user_bytes > limits.max_user_property_bytes {
        return Err(Refused(
            pb::Code::MessagePropertiesTooLarge,
            format!(
                "the total size of user properties, tag and keys is too large, max is {}",
                limits.max_user_property_bytes
            ),
        ));
    }
    let message_id = if sys.message_id.is_empty() {
        new_message_id()
    } else if legal_property("UNIQ_KEY", &sys.message_id) && sys.message_id.len() <= 128 {
        sys.message_id.clone()
    } else {
        return Err(Refused(pb::Code::IllegalMessageId, "illegal message id".into()));
    };
    pairs.push((properties::UNIQ_KEY.into(), message_id.clone()));
    let message_group = sys.message_group.clone().filter(|g| !g.is_empty());
    if let Some(g) = &message_group {
        // Apache's SendMessageActivity.validateMessageGroup.
        if !legal_property(SHARDING_KEY, g)
            || g.trim().is_empty()
            || g.len() >= limits.max_message_group_bytes
            || control(g)
        {
            return Err(Refused(
                pb::Code::IllegalMessageGroup,
                format!(
                    "illegal message group: whitespace only, a control character, or {} bytes or more",
                    limits.max_message_group_bytes
                ),
            ));
        }
        pairs.push((SHARDING_KEY.into(), g.clone()));
    }
    let deliver_at_ms = sys.delivery_timestamp.as_ref().map(timestamp_ms);
    if let Some(at) = deliver_at_ms {
        pairs.push((rokka_broker::timer::DELIVER_AT.into(), at.to_string()));
    }
    let transactional = sys.message_type() == pb::MessageType::Transaction;
    if transactional {
        pairs.push((TRAN_MSG.into(), "true".into()));
    }
    if let Some(tc) = sys
        .trace_context
        .as_deref()
        .filter(|t| legal_property(TRACE_CONTEXT, t))
    {
        pairs.push((TRACE_CONTEXT.into(), tc.to_string()));
    }
    let props = properties::encode(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    Ok(Incoming {
        topic,
        body,
        properties: props,
        message_id,
        born_timestamp_ms: sys
            .born_timestamp
            .as_ref()
            .map_or_else(rokka_store::now_ms, timestamp_ms),
        born_host: sys.born_host.parse().ok(),
        message_group,
        deliver_at_ms,
        transactional,
    })
}

/// A 5.x message id when the producer sent none: version 01, then random
/// bytes standing for the host and process, the time and a sequence.
pub fn new_message_id() -> String {
    let r: [u8; 16] = rand::random();
    format!("01{}", rokka_store::msgid::upper_hex(&r))
}

pub fn timestamp_ms(t: &prost_types::Timestamp) -> i64 {
    t.seconds
        .saturating_mul(1000)
        .saturating_add(i64::from(t.nanos / 1_000_000))
}

pub fn timestamp(ms: i64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: ms.div_euclid(1000),
        nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
    }
}

pub fn duration(ms: i64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: ms.div_euclid(1000),
        nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
    }
}

pub fn duration_ms(d: &prost_types::Duration) -> i64 {
    d.seconds
        .saturating_mul(1000)
        .saturating_add(i64::from(d.nanos / 1_000_000))
}

/// Names RocketMQ 5 clients see as system properties, not user ones.
const HIDDEN: &[&str] = &[
    DLQ_ORIGIN_TOPIC,
    DLQ_ORIGIN_MESSAGE_ID,
    SHARDING_KEY,
    TRACE_CONTEXT,
    "__CRC32#",
    "TIMER_DELIVER_MS",
    "TIMER_DELAY_SEC",
    "TIMER_DELAY_MS",
    "TIMER_OUT_MS",
    "TIMER_ENQUEUE_MS",
    "TIMER_DEQUEUE_MS",
    "TIMER_ROLL_TIMES",
    "__STARTDELIVERTIME",
    "KAFKA_KEY_HEX",
];

/// How one handout of a stored message is described to the consumer.
#[derive(Debug, Clone)]
pub struct Handout {
    pub receipt_handle: String,
    pub attempt: u32,
    pub invisible_ms: i64,
}

/// A stored message (a RocketMQ one, or a Kafka record converted to one)
/// as a RocketMQ 5 consumer receives it.
/// Without a handout (a transaction check) it has no receipt handle.
pub fn outgoing(m: &MessageView, store_host: SocketAddr, h: Option<&Handout>) -> pb::Message {
    let props = &m.properties[..];
    let text = |v: &[u8]| String::from_utf8_lossy(v).into_owned();
    let mut user = std::collections::HashMap::new();
    for (k, v) in properties::iter(props) {
        let k = text(k);
        if rokka_broker::convert::SYSTEM_PROPERTIES.contains(&k.as_str()) || HIDDEN.contains(&k.as_str()) {
            continue;
        }
        user.insert(k, text(v));
    }
    let group = properties::get(props, SHARDING_KEY).map(text);
    let deliver_at =
        properties::get(props, "TIMER_DELIVER_MS").and_then(|v| std::str::from_utf8(v).ok()?.parse::<i64>().ok());
    let message_type = if group.is_some() {
        pb::MessageType::Fifo
    } else if properties::get(props, TRAN_MSG) == Some(b"true") {
        pb::MessageType::Transaction
    } else if deliver_at.is_some() || properties::get(props, "DELAY").is_some() {
        pb::MessageType::Delay
    } else {
        pb::MessageType::Normal
    };
    // A body a remoting producer compressed (over 4 KiB, the COMPRESSED
    // flag) goes out decompressed as IDENTITY — every SDK reads that; one
    // that cannot be decompressed goes as stored, marked GZIP as Apache's
    // proxy marks every compressed body (the Java client detects the
    // format).
    let (body, encoding) = match rokka_broker::convert::plain_body(m) {
        Some(std::borrow::Cow::Borrowed(_)) => (m.body.clone(), pb::Encoding::Identity),
        Some(std::borrow::Cow::Owned(b)) => (bytes::Bytes::from(b), pb::Encoding::Identity),
        None => (m.body.clone(), pb::Encoding::Gzip),
    };
    let message_id = properties::get(props, properties::UNIQ_KEY)
        .map(text)
        .unwrap_or_else(|| rokka_store::msgid::message_id(m.store_host, m.phys_offset));
    let sys = pb::SystemProperties {
        tag: properties::get(props, properties::TAGS).map(text),
        keys: properties::get(props, properties::KEYS)
            .map(|k| text(k).split(' ').filter(|s| !s.is_empty()).map(String::from).collect())
            .unwrap_or_default(),
        message_id,
        // MD5 in upper-case hex, as Apache's proxy sends: every client
        // checks it the same way (their CRC32 renderings disagree).
        body_digest: Some(pb::Digest {
            r#type: pb::DigestType::Md5 as i32,
            checksum: format!("{:X}", md5::compute(&body)),
        }),
        body_encoding: encoding as i32,
        message_type: message_type as i32,
        born_timestamp: Some(timestamp(m.born_timestamp)),
        born_host: m.born_host.ip().to_string(),
        store_timestamp: Some(timestamp(m.store_timestamp)),
        store_host: store_host.to_string(),
        delivery_timestamp: deliver_at.map(timestamp),
        receipt_handle: h.map(|h| h.receipt_handle.clone()),
        queue_id: m.queue_id as i32,
        queue_offset: Some(m.queue_offset as i64),
        invisible_duration: h.map(|h| duration(h.invisible_ms)),
        delivery_attempt: h.map(|h| h.attempt as i32),
        message_group: group,
        trace_context: properties::get(props, TRACE_CONTEXT).map(text),
        dead_letter_queue: match (
            properties::get(props, DLQ_ORIGIN_TOPIC),
            properties::get(props, DLQ_ORIGIN_MESSAGE_ID),
        ) {
            (Some(t), Some(id)) => Some(pb::DeadLetterQueue {
                topic: text(t),
                message_id: text(id),
            }),
            _ => None,
        },
        ..Default::default()
    };
    pb::Message {
        topic: Some(pb::Resource {
            resource_namespace: String::new(),
            name: m.topic_str().to_string(),
        }),
        user_properties: user,
        system_properties: Some(sys),
        body,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_body: usize) -> SendLimits {
        SendLimits {
            max_body,
            ..SendLimits::of(&crate::GrpcConfig::default())
        }
    }

    fn msg(sys: pb::SystemProperties, user: &[(&str, &str)]) -> pb::Message {
        pb::Message {
            topic: Some(pb::Resource {
                resource_namespace: String::new(),
                name: "t".into(),
            }),
            user_properties: user.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            system_properties: Some(sys),
            body: bytes::Bytes::from_static(b"hello"),
        }
    }

    #[test]
    fn a_message_maps_to_remoting_properties() {
        let sys = pb::SystemProperties {
            tag: Some("TagA".into()),
            keys: vec!["k1".into(), "k2".into()],
            message_id: "01ABC".into(),
            message_group: Some("g1".into()),
            ..Default::default()
        };
        let i = incoming(&msg(sys, &[("color", "red")]), &limits(1024)).expect("legal");
        let p = i.properties.as_bytes();
        assert_eq!(properties::get(p, "TAGS"), Some(&b"TagA"[..]));
        assert_eq!(properties::get(p, "KEYS"), Some(&b"k1 k2"[..]));
        assert_eq!(properties::get(p, "UNIQ_KEY"), Some(&b"01ABC"[..]));
        assert_eq!(properties::get(p, SHARDING_KEY), Some(&b"g1"[..]));
        assert_eq!(properties::get(p, "color"), Some(&b"red"[..]));
    }

    #[test]
    fn illegal_messages_are_refused_with_their_code() {
        let code = |m: pb::Message, max| incoming(&m, &limits(max)).map(|_| ()).map_err(|r| r.0);
        assert_eq!(
            code(msg(Default::default(), &[("KEYS", "x")]), 1024),
            Err(pb::Code::IllegalMessagePropertyKey)
        );
        assert_eq!(
            code(msg(Default::default(), &[("a\u{1}", "x")]), 1024),
            Err(pb::Code::IllegalMessagePropertyKey)
        );
        assert_eq!(
            code(msg(Default::default(), &[]), 3),
            Err(pb::Code::MessageBodyTooLarge)
        );
        let mut empty = msg(Default::default(), &[]);
        empty.body = bytes::Bytes::new();
        assert_eq!(code(empty, 1024), Err(pb::Code::MessageBodyEmpty));
        let mut no_topic = msg(Default::default(), &[]);
        no_topic.topic = None;
        assert_eq!(code(no_topic, 1024), Err(pb::Code::IllegalTopic));
        let bad_tag = pb::SystemProperties {
            tag: Some("a||b".into()),
            ..Default::default()
        };
        assert_eq!(code(msg(bad_tag, &[]), 1024), Err(pb::Code::IllegalMessageTag));
        // Apache's proxy checks: a tag without `|`, not blank, no control
        // character; a message group under 64 bytes, not blank; at most
        // 128 user properties of 16 KiB with the tag and keys.
        for tag in ["a|b", "  ", "a\tb"] {
            let sys = pb::SystemProperties {
                tag: Some(tag.into()),
                ..Default::default()
            };
            assert_eq!(code(msg(sys, &[]), 1024), Err(pb::Code::IllegalMessageTag), "{tag:?}");
        }
        for group in [" ".repeat(3), "g".repeat(64), "a\u{7f}".into()] {
            let sys = pb::SystemProperties {
                message_group: Some(group.clone()),
                ..Default::default()
            };
            assert_eq!(
                code(msg(sys, &[]), 1024),
                Err(pb::Code::IllegalMessageGroup),
                "{group:?}"
            );
        }
        let ok_group = pb::SystemProperties {
            message_group: Some("g".repeat(63)),
            ..Default::default()
        };
        assert_eq!(code(msg(ok_group, &[]), 1024), Ok(()));
        assert_eq!(
            code(msg(Default::default(), &[("k", "line\nbreak")]), 1024),
            Err(pb::Code::IllegalMessagePropertyKey)
        );
        let names: Vec<String> = (0..129).map(|i| format!("p{i}")).collect();
        let many: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "v")).collect();
        assert_eq!(
            code(msg(Default::default(), &many), 1024),
            Err(pb::Code::MessagePropertiesTooLarge)
        );
        assert_eq!(code(msg(Default::default(), &many[..128]), 1024), Ok(()));
        let big = "v".repeat(16 * 1024);
        assert_eq!(
            code(msg(Default::default(), &[("k", big.as_str())]), 1024),
            Err(pb::Code::MessagePropertiesTooLarge)
        );
    }
}
