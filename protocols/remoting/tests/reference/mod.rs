//! The JSON header decoder as it was before the one-pass decoder (the whole
//! header into a `serde_json::Value`, then fields out of its map): the
//! reference the property test in tests/codec.rs holds the decoder to, and
//! what benches/codec.rs measures it against.

use bytes::Bytes;
use rokka_remoting::{ExtFields, LanguageCode, RemotingCommand, SerializeType};

/// A JSON header read the old way; None where the decoder refuses it.
pub fn reference_json(h: &[u8]) -> Option<RemotingCommand> {
    use serde_json::Value;
    let int = |v: &Value| match v {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    };
    let Ok(Value::Object(o)) = serde_json::from_slice::<Value>(h) else {
        return None;
    };
    let code = o.get("code").and_then(int)?;
    let language = match o.get("language") {
        Some(Value::String(s)) => LanguageCode::from_name(s),
        Some(v) => int(v).map_or(LanguageCode::Other, |c| LanguageCode::from_code(c as u8)),
        None => LanguageCode::Other,
    };
    let field = |k: &str| o.get(k).and_then(int).unwrap_or(0) as i32;
    let mut ext = ExtFields::default();
    if let Some(Value::Object(e)) = o.get("extFields") {
        for (k, v) in e {
            let t = match v {
                Value::String(s) => Some(s.clone()),
                Value::Null => None,
                Value::Bool(b) => Some(b.to_string()),
                Value::Number(n) => Some(n.to_string()),
                other => Some(other.to_string()),
            };
            if let Some(t) = t {
                ext.0.push((k.clone().into(), t));
            }
        }
    }
    Some(RemotingCommand {
        code: code as i32,
        language,
        version: field("version"),
        opaque: field("opaque"),
        flag: field("flag"),
        remark: o.get("remark").and_then(|r| r.as_str()).map(String::from),
        ext_fields: ext,
        serialize_type: SerializeType::Json,
        body: Bytes::new(),
    })
}
