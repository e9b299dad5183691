//! RocketMQ message properties: `name 0x01 value 0x02 ...` and the hashes the
//! store derives from them.

/// Separates a property's name from its value.
pub const NAME_VALUE_SEPARATOR: u8 = 0x01;
/// Ends each property.
pub const PROPERTY_SEPARATOR: u8 = 0x02;

/// Tag used by consumers' tag filters.
pub const TAGS: &str = "TAGS";
/// Space-separated business keys, indexed as `topic#key`.
pub const KEYS: &str = "KEYS";
/// The client-generated unique message id, indexed as `topic#id`.
pub const UNIQ_KEY: &str = "UNIQ_KEY";

/// Iterates `(name, value)` pairs of an encoded property block. Malformed
/// trailing bytes (a name without a separator) are ignored, as the Java
/// decoder does.
pub fn iter(props: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    props.split(|b| *b == PROPERTY_SEPARATOR).filter_map(|kv| {
        let i = kv.iter().position(|b| *b == NAME_VALUE_SEPARATOR)?;
        Some((&kv[..i], &kv[i + 1..]))
    })
}

/// The value of property `name`, if present.
pub fn get<'a>(props: &'a [u8], name: &str) -> Option<&'a [u8]> {
    iter(props).find(|(k, _)| *k == name.as_bytes()).map(|(_, v)| v)
}

/// Encodes `(name, value)` pairs into a property block.
pub fn encode<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut out = String::new();
    for (k, v) in pairs {
        out.push_str(k);
        out.push(NAME_VALUE_SEPARATOR as char);
        out.push_str(v);
        out.push(PROPERTY_SEPARATOR as char);
    }
    out
}

/// Java's `String.hashCode()` over the UTF-16 code units of `s` (invalid UTF-8
/// is hashed byte by byte, as Latin-1 would be).
pub fn java_string_hash(s: &[u8]) -> i32 {
    java_hash_extend(0, s)
}

/// Continues a Java string hash over more text: hashing `a` then `b` equals
/// hashing `a + b` (for whole UTF-8 pieces).
pub fn java_hash_extend(mut h: i32, s: &[u8]) -> i32 {
    if s.is_ascii() {
        for b in s {
            h = h.wrapping_mul(31).wrapping_add(i32::from(*b));
        }
        return h;
    }
    match std::str::from_utf8(s) {
        Ok(text) => {
            for unit in text.encode_utf16() {
                h = h.wrapping_mul(31).wrapping_add(i32::from(unit));
            }
        }
        Err(_) => {
            for b in s {
                h = h.wrapping_mul(31).wrapping_add(i32::from(*b));
            }
        }
    }
    h
}

/// The ConsumeQueue tag code of a message: the Java hash of its `TAGS`
/// property, sign-extended; 0 without tags.
pub fn tag_code(props: &[u8]) -> i64 {
    match get(props, TAGS) {
        Some(tags) if !tags.is_empty() => i64::from(java_string_hash(tags)),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn java_hash_matches_java() {
        // Values computed by java.lang.String#hashCode.
        assert_eq!(java_string_hash(b""), 0);
        assert_eq!(java_string_hash(b"TagA"), 2_598_919);
        assert_eq!(java_string_hash(b"hello"), 99_162_322);
        assert_eq!(java_string_hash("héllo".as_bytes()), 103_094_734);
        // A character outside the BMP hashes as its surrogate pair.
        assert_eq!(java_string_hash("😀".as_bytes()), 1_772_899);
    }

    #[test]
    fn encode_get_iter() {
        let p = encode([("TAGS", "TagA"), ("KEYS", "k1 k2"), ("UNIQ_KEY", "ABC")]);
        assert_eq!(get(p.as_bytes(), TAGS), Some(&b"TagA"[..]));
        assert_eq!(get(p.as_bytes(), KEYS), Some(&b"k1 k2"[..]));
        assert_eq!(get(p.as_bytes(), "NOPE"), None);
        assert_eq!(iter(p.as_bytes()).count(), 3);
        assert_eq!(tag_code(p.as_bytes()), 2_598_919);
        assert_eq!(tag_code(b""), 0);
    }
}
