//! Frame encode/decode. `decode` takes whole frames off a read buffer and
//! never panics on malformed input; `encode` appends one frame.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde_json::Value;

use crate::command::{ExtFields, FieldName, LanguageCode, RemotingCommand, SerializeType};

/// Largest frame accepted by default (RocketMQ's frameMaxLength, 16 MiB).
pub const DEFAULT_MAX_FRAME: usize = 16 * 1024 * 1024;

/// Why bytes are not a frame. Every variant means "close this connection".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {len} bytes exceeds the maximum of {max}")]
    TooLarge { len: usize, max: usize },
    #[error("frame length {0} is too short for a header word")]
    TooShort(usize),
    #[error("header length {header} exceeds the frame's {frame} bytes")]
    HeaderPastEnd { header: usize, frame: usize },
    #[error("unknown serialize type {0}")]
    UnknownSerializeType(u8),
    #[error("bad header: {0}")]
    BadHeader(String),
}

/// Takes one whole frame off the front of `buf`. `Ok(None)`: not all of it
/// has arrived yet (nothing is consumed).
pub fn decode(buf: &mut BytesMut, max_frame: usize) -> Result<Option<RemotingCommand>, FrameError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len > max_frame {
        return Err(FrameError::TooLarge { len, max: max_frame });
    }
    if len < 4 {
        return Err(FrameError::TooShort(len));
    }
    if buf.len() < 4 + len {
        return Ok(None);
    }
    let mut frame = buf.split_to(4 + len).freeze();
    frame.advance(4);
    let word = frame.get_u32();
    let header_len = (word & 0x00FF_FFFF) as usize;
    if header_len > len - 4 {
        return Err(FrameError::HeaderPastEnd {
            header: header_len,
            frame: len,
        });
    }
    let header = frame.split_to(header_len);
    let body = frame;
    let mut cmd = match (word >> 24) as u8 {
        0 => decode_json(&header)?,
        1 => decode_binary(&header)?,
        other => return Err(FrameError::UnknownSerializeType(other)),
    };
    cmd.body = body;
    Ok(Some(cmd))
}

fn bad(s: impl Into<String>) -> FrameError {
    FrameError::BadHeader(s.into())
}

/// A JSON value as an integer: numbers, or strings holding one.
fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// A JSON value as an extFields string (fastjson coerces scalars the same way).
fn text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Null => None,
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        other => Some(other.to_string()),
    }
}

/// A JSON value as an extFields string, taking its text when it is one.
fn into_text(v: Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s),
        other => text(&other),
    }
}

/// What a JSON header is read into, in one pass: the scalar fields as JSON
/// values (numbers cost no allocation), extFields straight into
/// (key, value) pairs — no tree of values, no map, no copies.
#[derive(Default)]
struct JsonHeader {
    code: Option<Value>,
    language: Option<Value>,
    version: Option<Value>,
    opaque: Option<Value>,
    flag: Option<Value>,
    remark: Option<Value>,
    ext: Vec<(FieldName, String)>,
}

/// The header's top-level keys; others are skipped unread.
#[derive(serde::Deserialize)]
#[serde(field_identifier, rename_all = "camelCase")]
enum Key {
    Code,
    Language,
    Version,
    Opaque,
    Flag,
    Remark,
    ExtFields,
    #[serde(other)]
    Other,
}

impl<'de> serde::Deserialize<'de> for JsonHeader {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<JsonHeader, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = JsonHeader;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<JsonHeader, A::Error> {
                let mut h = JsonHeader::default();
                // A key given twice: the last one counts (as in a map).
                while let Some(key) = map.next_key::<Key>()? {
                    match key {
                        Key::Code => h.code = Some(map.next_value()?),
                        Key::Language => h.language = Some(map.next_value()?),
                        Key::Version => h.version = Some(map.next_value()?),
                        Key::Opaque => h.opaque = Some(map.next_value()?),
                        Key::Flag => h.flag = Some(map.next_value()?),
                        Key::Remark => h.remark = Some(map.next_value()?),
                        Key::ExtFields => h.ext = map.next_value::<ExtPairs>()?.0,
                        Key::Other => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                        }
                    }
                }
                Ok(h)
            }
        }
        d.deserialize_map(V)
    }
}

/// extFields as (key, text) pairs in key order, a key given twice keeping
/// its last value (what reading them into a map and out gave); a value that
/// is not an object's (null, a string...) gives none.
struct ExtPairs(Vec<(FieldName, String)>);

/// An extFields key read as a [`FieldName`] (no allocation for the names
/// of the table).
struct Name(FieldName);

impl<'de> serde::Deserialize<'de> for Name {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Name, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Name;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an extFields key")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Name, E> {
                Ok(Name(crate::command::field_name(s)))
            }
        }
        d.deserialize_str(V)
    }
}

impl<'de> serde::Deserialize<'de> for ExtPairs {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ExtPairs, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = ExtPairs;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("extFields")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<ExtPairs, A::Error> {
                let mut v: Vec<(FieldName, Option<String>)> = Vec::with_capacity(map.size_hint().unwrap_or(16).min(64));
                while let Some(Name(k)) = map.next_key::<Name>()? {
                    // null: no value (a later one may still give the key one).
                    let value: Value = map.next_value()?;
                    v.push((k, into_text(value)));
                }
                // Key order (stable: a key given twice keeps its values in
                // the order given); of those, the last counts.
                v.sort_by(|a, b| a.0.cmp(&b.0));
                v.dedup_by(|later, kept| {
                    if later.0 == kept.0 {
                        std::mem::swap(later, kept);
                        true
                    } else {
                        false
                    }
                });
                Ok(ExtPairs(v.into_iter().filter_map(|(k, t)| Some((k, t?))).collect()))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<ExtPairs, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(ExtPairs(Vec::new()))
            }
            fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<ExtPairs, E> {
                Ok(ExtPairs(Vec::new()))
            }
            fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<ExtPairs, E> {
                Ok(ExtPairs(Vec::new()))
            }
            fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<ExtPairs, E> {
                Ok(ExtPairs(Vec::new()))
            }
            fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<ExtPairs, E> {
                Ok(ExtPairs(Vec::new()))
            }
            fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<ExtPairs, E> {
                Ok(ExtPairs(Vec::new()))
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<ExtPairs, E> {
                Ok(ExtPairs(Vec::new()))
            }
        }
        d.deserialize_any(V)
    }
}

fn decode_json(h: &[u8]) -> Result<RemotingCommand, FrameError> {
    // Nothing inside a header can be of a wrong type (every value is taken
    // as it comes): a data error is the header itself not being an object.
    let header: JsonHeader = serde_json::from_slice(h).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => bad("JSON header is not an object"),
        _ => bad(format!("JSON header: {e}")),
    })?;
    let code = header
        .code
        .as_ref()
        .and_then(int)
        .ok_or_else(|| bad("JSON header without a code"))?;
    let language = match &header.language {
        Some(Value::String(s)) => LanguageCode::from_name(s),
        Some(v) => int(v).map_or(LanguageCode::Other, |c| LanguageCode::from_code(c as u8)),
        None => LanguageCode::Other,
    };
    let field = |v: &Option<Value>| v.as_ref().and_then(int).unwrap_or(0) as i32;
    Ok(RemotingCommand {
        code: code as i32,
        language,
        version: field(&header.version),
        opaque: field(&header.opaque),
        flag: field(&header.flag),
        remark: match header.remark {
            Some(Value::String(r)) => Some(r),
            _ => None,
        },
        ext_fields: ExtFields(header.ext),
        serialize_type: SerializeType::Json,
        body: Bytes::new(),
    })
}

fn take<'a>(h: &mut &'a [u8], n: usize, what: &str) -> Result<&'a [u8], FrameError> {
    if h.len() < n {
        return Err(bad(format!("binary header truncated in {what}")));
    }
    let (a, b) = h.split_at(n);
    *h = b;
    Ok(a)
}

fn be_i32(h: &mut &[u8], what: &str) -> Result<i32, FrameError> {
    let b = take(h, 4, what)?;
    Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

fn utf8(b: &[u8], what: &str) -> Result<String, FrameError> {
    String::from_utf8(b.to_vec()).map_err(|_| bad(format!("{what} is not UTF-8")))
}

fn decode_binary(header: &[u8]) -> Result<RemotingCommand, FrameError> {
    let mut h = header;
    let code = {
        let b = take(&mut h, 2, "code")?;
        i32::from(i16::from_be_bytes([b[0], b[1]]))
    };
    let language = LanguageCode::from_code(take(&mut h, 1, "language")?[0]);
    let version = {
        let b = take(&mut h, 2, "version")?;
        i32::from(i16::from_be_bytes([b[0], b[1]]))
    };
    let opaque = be_i32(&mut h, "opaque")?;
    let flag = be_i32(&mut h, "flag")?;
    let remark_len = be_i32(&mut h, "remark length")?;
    if remark_len < 0 {
        return Err(bad("negative remark length"));
    }
    let remark = match remark_len {
        0 => None,
        n => Some(utf8(take(&mut h, n as usize, "remark")?, "remark")?),
    };
    let ext_len = be_i32(&mut h, "extFields length")?;
    if ext_len < 0 {
        return Err(bad("negative extFields length"));
    }
    let mut e = take(&mut h, ext_len as usize, "extFields")?;
    let mut ext = ExtFields::default();
    while !e.is_empty() {
        let kl = {
            let b = take(&mut e, 2, "extFields key length")?;
            u16::from_be_bytes([b[0], b[1]]) as usize
        };
        let k = std::str::from_utf8(take(&mut e, kl, "extFields key")?)
            .map(crate::command::field_name)
            .map_err(|_| bad("extFields key is not UTF-8"))?;
        let vl = be_i32(&mut e, "extFields value length")?;
        if vl < 0 {
            return Err(bad("negative extFields value length"));
        }
        let v = utf8(take(&mut e, vl as usize, "extFields value")?, "extFields value")?;
        ext.0.push((k, v));
    }
    Ok(RemotingCommand {
        code,
        language,
        version,
        opaque,
        flag,
        remark,
        ext_fields: ext,
        serialize_type: SerializeType::RocketMq,
        body: Bytes::new(),
    })
}

/// Appends `cmd` as one frame, its header in `cmd.serialize_type`.
pub fn encode(cmd: &RemotingCommand, out: &mut BytesMut) {
    let header = match cmd.serialize_type {
        SerializeType::Json => encode_json(cmd),
        SerializeType::RocketMq => encode_binary(cmd),
    };
    let st: u32 = match cmd.serialize_type {
        SerializeType::Json => 0,
        SerializeType::RocketMq => 1,
    };
    out.reserve(8 + header.len() + cmd.body.len());
    out.put_u32((4 + header.len() + cmd.body.len()) as u32);
    out.put_u32((st << 24) | (header.len() as u32 & 0x00FF_FFFF));
    out.put_slice(&header);
    out.put_slice(&cmd.body);
}

fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// Fields in alphabetical order, nulls omitted, as fastjson writes them.
fn encode_json(cmd: &RemotingCommand) -> Vec<u8> {
    let mut s = String::with_capacity(128);
    s.push_str("{\"code\":");
    s.push_str(&cmd.code.to_string());
    if !cmd.ext_fields.is_empty() {
        s.push_str(",\"extFields\":{");
        for (i, (k, v)) in cmd.ext_fields.0.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            s.push_str(&json_str(k));
            s.push(':');
            s.push_str(&json_str(v));
        }
        s.push('}');
    }
    s.push_str(",\"flag\":");
    s.push_str(&cmd.flag.to_string());
    s.push_str(",\"language\":\"");
    s.push_str(cmd.language.name());
    s.push_str("\",\"opaque\":");
    s.push_str(&cmd.opaque.to_string());
    if let Some(r) = &cmd.remark {
        s.push_str(",\"remark\":");
        s.push_str(&json_str(r));
    }
    s.push_str(",\"serializeTypeCurrentRPC\":\"JSON\",\"version\":");
    s.push_str(&cmd.version.to_string());
    s.push('}');
    s.into_bytes()
}

fn encode_binary(cmd: &RemotingCommand) -> Vec<u8> {
    let mut h = Vec::with_capacity(64);
    // Codes above i16 (5.x POP family) only work in JSON, as in Java.
    h.extend_from_slice(&(cmd.code as i16).to_be_bytes());
    h.push(cmd.language.code());
    h.extend_from_slice(&(cmd.version as i16).to_be_bytes());
    h.extend_from_slice(&cmd.opaque.to_be_bytes());
    h.extend_from_slice(&cmd.flag.to_be_bytes());
    match &cmd.remark {
        Some(r) if !r.is_empty() => {
            h.extend_from_slice(&(r.len() as i32).to_be_bytes());
            h.extend_from_slice(r.as_bytes());
        }
        _ => h.extend_from_slice(&0i32.to_be_bytes()),
    }
    let ext_len: usize = cmd.ext_fields.0.iter().map(|(k, v)| 2 + k.len() + 4 + v.len()).sum();
    h.extend_from_slice(&(ext_len as i32).to_be_bytes());
    for (k, v) in &cmd.ext_fields.0 {
        h.extend_from_slice(&(k.len() as u16).to_be_bytes());
        h.extend_from_slice(k.as_bytes());
        h.extend_from_slice(&(v.len() as i32).to_be_bytes());
        h.extend_from_slice(v.as_bytes());
    }
    h
}
