//! RocketMQ "offset message ids": hex of the store host (IP bytes + port as
//! i32) and the record's CommitLog offset, as `MessageDecoder#createMessageId`.

use std::net::{IpAddr, SocketAddr};

/// The message id of the record at `phys` stored by `host`.
pub fn message_id(host: SocketAddr, phys: u64) -> String {
    let mut raw = Vec::with_capacity(28);
    match host.ip() {
        IpAddr::V4(ip) => raw.extend_from_slice(&ip.octets()),
        IpAddr::V6(ip) => raw.extend_from_slice(&ip.octets()),
    }
    raw.extend_from_slice(&i32::from(host.port()).to_be_bytes());
    raw.extend_from_slice(&phys.to_be_bytes());
    upper_hex(&raw)
}

/// `bytes` as upper-case hex, two digits each (one allocation; a
/// `format!` per byte was 16–28 allocations per message id).
pub fn upper_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    s
}

/// Splits a message id into store host and CommitLog offset.
pub fn parse_message_id(id: &str) -> Option<(SocketAddr, u64)> {
    if !id.is_ascii() || !id.len().is_multiple_of(2) {
        return None;
    }
    let raw: Option<Vec<u8>> = (0..id.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&id[i..i + 2], 16).ok())
        .collect();
    let raw = raw?;
    let ip_len = match raw.len() {
        16 => 4,
        28 => 16,
        _ => return None,
    };
    let ip = if ip_len == 4 {
        IpAddr::from(<[u8; 4]>::try_from(&raw[..4]).ok()?)
    } else {
        IpAddr::from(<[u8; 16]>::try_from(&raw[..16]).ok()?)
    };
    let port = i32::from_be_bytes(raw[ip_len..ip_len + 4].try_into().ok()?);
    let phys = u64::from_be_bytes(raw[ip_len + 4..].try_into().ok()?);
    Some((SocketAddr::new(ip, port as u16), phys))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let h: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 10911));
        let id = message_id(h, 0x1234);
        assert_eq!(id, "7F00000100002A9F0000000000001234");
        assert_eq!(upper_hex(&[0x00, 0x0f, 0xab, 0xff, 0x90]), "000FABFF90");
        assert_eq!(parse_message_id(&id), Some((h, 0x1234)));
        let h6: SocketAddr = "[::1]:10911".parse().unwrap_or(h);
        assert_eq!(parse_message_id(&message_id(h6, 9)), Some((h6, 9)));
        assert_eq!(parse_message_id("zz"), None);
        assert_eq!(parse_message_id("00"), None);
    }
}
