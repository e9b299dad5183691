//! The RocketMQ message record, byte-compatible with `MessageExtEncoder`
//! (see `shared/protocols/rocketmq-store.md` §1.2). All integers big-endian.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use bytes::Bytes;

use super::{properties, DecodeError};

/// Magic of a v1 record (1-byte topic length).
pub const MAGIC_V1: u32 = 0xDAA3_20A7;
/// Magic of a v2 record (2-byte topic length), used for topics over 127 bytes.
pub const MAGIC_V2: u32 = 0xDAA3_20AB;

/// SYSFLAG bits the store looks at.
pub mod sysflag {
    pub const COMPRESSED: i32 = 0x1;
    pub const MULTI_TAGS: i32 = 0x2;
    pub const TRANSACTION_MASK: i32 = 0xC;
    pub const TRANSACTION_NOT_TYPE: i32 = 0x0;
    pub const TRANSACTION_PREPARED: i32 = 0x4;
    pub const TRANSACTION_COMMIT: i32 = 0x8;
    pub const TRANSACTION_ROLLBACK: i32 = 0xC;
    pub const BORNHOST_V6: i32 = 0x10;
    pub const STOREHOST_V6: i32 = 0x20;
}

/// Body CRC as RocketMQ computes it: IEEE CRC-32 with the top bit cleared.
pub fn body_crc(body: &[u8]) -> u32 {
    crc32fast::hash(body) & 0x7FFF_FFFF
}

/// The property RocketMQ appends when `enabledAppendPropCRC` is on: a CRC-32
/// of the whole record but these 20 bytes, as 10 digits, least significant
/// first (`MessageDecoder#createCrc32`). Rokka writes it on every record so
/// that recovery checks every byte, not only the body.
pub const PROP_CRC_NAME: &[u8] = b"__CRC32#";
/// Bytes the record-CRC property takes at the end of the properties.
pub const PROP_CRC_LEN: usize = 20;

fn write_prop_crc(out: &mut [u8], crc: u32) {
    out[..8].copy_from_slice(PROP_CRC_NAME);
    out[8] = properties::NAME_VALUE_SEPARATOR;
    let mut v = crc;
    for d in out[9..19].iter_mut() {
        *d = b'0' + (v % 10) as u8;
        v /= 10;
    }
    out[19] = properties::PROPERTY_SEPARATOR;
}

fn read_prop_crc(props: &[u8]) -> Option<u32> {
    let tail = props.get(props.len().checked_sub(PROP_CRC_LEN)?..)?;
    if &tail[..8] != PROP_CRC_NAME
        || tail[8] != properties::NAME_VALUE_SEPARATOR
        || tail[19] != properties::PROPERTY_SEPARATOR
    {
        return None;
    }
    let mut v: u64 = 0;
    for d in tail[9..19].iter().rev() {
        if !d.is_ascii_digit() {
            return None;
        }
        v = v * 10 + u64::from(d - b'0');
    }
    u32::try_from(v).ok()
}

/// A message as a producer hands it to the store.
#[derive(Debug, Clone)]
pub struct MessageInput<'a> {
    pub topic: &'a str,
    pub queue_id: u32,
    pub flag: i32,
    pub body: &'a [u8],
    /// Encoded properties (`name 0x01 value 0x02 ...`).
    pub properties: &'a [u8],
    /// SYSFLAG from the producer; host bits are set by the store.
    pub sys_flag: i32,
    pub born_timestamp: i64,
    pub born_host: SocketAddr,
    pub reconsume_times: i32,
    pub prepared_transaction_offset: i64,
}

impl<'a> MessageInput<'a> {
    /// A plain message with default metadata, as tests and simple callers want.
    pub fn new(topic: &'a str, queue_id: u32, body: &'a [u8], properties: &'a [u8]) -> Self {
        MessageInput {
            topic,
            queue_id,
            flag: 0,
            body,
            properties,
            sys_flag: 0,
            born_timestamp: crate::now_ms(),
            born_host: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
            reconsume_times: 0,
            prepared_transaction_offset: 0,
        }
    }

    /// Whether the message takes a queue offset and a ConsumeQueue entry:
    /// prepared and rolled-back transaction records do not.
    pub fn is_consumable(&self) -> bool {
        is_consumable(self.sys_flag)
    }
}

pub(crate) fn is_consumable(sys_flag: i32) -> bool {
    matches!(
        sys_flag & sysflag::TRANSACTION_MASK,
        sysflag::TRANSACTION_NOT_TYPE | sysflag::TRANSACTION_COMMIT
    )
}

pub(crate) fn is_indexable(sys_flag: i32) -> bool {
    sys_flag & sysflag::TRANSACTION_MASK != sysflag::TRANSACTION_ROLLBACK
}

fn host_len(addr: &SocketAddr) -> usize {
    match addr {
        SocketAddr::V4(_) => 8,
        SocketAddr::V6(_) => 20,
    }
}

fn topic_len_width(topic: &str) -> usize {
    if topic.len() > 127 {
        2
    } else {
        1
    }
}

/// Total stored size of `m` with the given store host (and the record-CRC
/// property when `record_crc`).
pub fn encoded_len(m: &MessageInput<'_>, store_host: &SocketAddr, record_crc: bool) -> usize {
    4 + 4
        + 4
        + 4
        + 4
        + 8
        + 8
        + 4
        + 8
        + host_len(&m.born_host)
        + 8
        + host_len(store_host)
        + 4
        + 8
        + 4
        + m.body.len()
        + topic_len_width(m.topic)
        + m.topic.len()
        + 2
        + m.properties.len()
        + if record_crc { PROP_CRC_LEN } else { 0 }
}

/// Values fixed by the store at append time.
#[derive(Debug, Clone, Copy)]
pub struct Placement {
    pub queue_offset: u64,
    pub phys_offset: u64,
    pub store_timestamp: i64,
    /// Full IEEE CRC-32 of the body (`crc32fast::hash`), computed before the
    /// append lock is taken.
    pub body_crc32: u32,
    /// Append the record-CRC property (the store always does; tests may not).
    pub record_crc: bool,
}

struct Cursor<'b> {
    buf: &'b mut [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn put(&mut self, data: &[u8]) {
        self.buf[self.pos..self.pos + data.len()].copy_from_slice(data);
        self.pos += data.len();
    }
    fn host(&mut self, addr: &SocketAddr) {
        match addr.ip() {
            IpAddr::V4(ip) => self.put(&ip.octets()),
            IpAddr::V6(ip) => self.put(&ip.octets()),
        }
        self.put(&i32::from(addr.port()).to_be_bytes());
    }
}

/// Encodes `m` into `buf`, which must be exactly [`encoded_len`] long.
pub fn encode(buf: &mut [u8], m: &MessageInput<'_>, store_host: &SocketAddr, at: Placement) {
    let total = buf.len();
    let mut sys_flag = m.sys_flag & !(sysflag::BORNHOST_V6 | sysflag::STOREHOST_V6);
    if m.born_host.is_ipv6() {
        sys_flag |= sysflag::BORNHOST_V6;
    }
    if store_host.is_ipv6() {
        sys_flag |= sysflag::STOREHOST_V6;
    }
    let v2 = topic_len_width(m.topic) == 2;
    let mut c = Cursor { buf, pos: 0 };
    c.put(&(total as u32).to_be_bytes());
    c.put(&(if v2 { MAGIC_V2 } else { MAGIC_V1 }).to_be_bytes());
    c.put(&(at.body_crc32 & 0x7FFF_FFFF).to_be_bytes());
    c.put(&m.queue_id.to_be_bytes());
    c.put(&m.flag.to_be_bytes());
    c.put(&at.queue_offset.to_be_bytes());
    c.put(&at.phys_offset.to_be_bytes());
    c.put(&sys_flag.to_be_bytes());
    c.put(&m.born_timestamp.to_be_bytes());
    c.host(&m.born_host);
    c.put(&at.store_timestamp.to_be_bytes());
    c.host(store_host);
    c.put(&m.reconsume_times.to_be_bytes());
    c.put(&m.prepared_transaction_offset.to_be_bytes());
    c.put(&(m.body.len() as u32).to_be_bytes());
    c.put(m.body);
    if v2 {
        c.put(&(m.topic.len() as u16).to_be_bytes());
    } else {
        c.put(&[m.topic.len() as u8]);
    }
    c.put(m.topic.as_bytes());
    let props_len = m.properties.len() + if at.record_crc { PROP_CRC_LEN } else { 0 };
    c.put(&(props_len as u16).to_be_bytes());
    c.put(m.properties);
    if at.record_crc {
        // One pass over the record: cheaper than combining with the body CRC
        // (crc32fast's combine costs more than re-hashing a few KiB).
        let crc = crc32fast::hash(&c.buf[..total - PROP_CRC_LEN]) & 0x7FFF_FFFF;
        write_prop_crc(&mut c.buf[total - PROP_CRC_LEN..], crc);
        c.pos = total;
    }
    debug_assert_eq!(c.pos, total);
}

/// A stored message, decoded without copying: byte fields are views of the
/// record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageView {
    pub total_size: u32,
    pub magic: u32,
    pub body_crc: u32,
    pub queue_id: u32,
    pub flag: i32,
    pub queue_offset: u64,
    pub phys_offset: u64,
    pub sys_flag: i32,
    pub born_timestamp: i64,
    pub born_host: SocketAddr,
    pub store_timestamp: i64,
    pub store_host: SocketAddr,
    pub reconsume_times: i32,
    pub prepared_transaction_offset: i64,
    pub body: Bytes,
    pub topic: Bytes,
    pub properties: Bytes,
}

impl MessageView {
    /// The topic as text (topics are validated UTF-8 at append).
    pub fn topic_str(&self) -> &str {
        std::str::from_utf8(&self.topic).unwrap_or("")
    }

    /// A property's value.
    pub fn property(&self, name: &str) -> Option<&[u8]> {
        properties::get(&self.properties, name)
    }

    /// Whether the stored body CRC matches the body.
    pub fn crc_ok(&self) -> bool {
        body_crc(&self.body) == self.body_crc
    }

    /// Checks the body CRC and the record-CRC property over the whole record
    /// (`rec` = the record's bytes). Every record Rokka writes carries that
    /// property, so one without it is damaged.
    pub fn record_crc_ok(&self, rec: &[u8]) -> bool {
        if !self.crc_ok() {
            return false;
        }
        match read_prop_crc(&self.properties) {
            Some(want) => (crc32fast::hash(&rec[..rec.len() - PROP_CRC_LEN]) & 0x7FFF_FFFF) == want,
            None => false,
        }
    }

    /// This message again as an append input to `topic` / `queue_id` with
    /// `properties` (re-deliveries: delays, retries, transactions), keeping
    /// body, flag, sysFlag, born time and host, and reconsume times.
    pub fn as_input<'a>(&'a self, topic: &'a str, queue_id: u32, properties: &'a [u8]) -> MessageInput<'a> {
        MessageInput {
            topic,
            queue_id,
            flag: self.flag,
            body: &self.body,
            properties,
            sys_flag: self.sys_flag,
            born_timestamp: self.born_timestamp,
            born_host: self.born_host,
            reconsume_times: self.reconsume_times,
            prepared_transaction_offset: 0,
        }
    }

    /// Properties without the record-CRC property (what clients set).
    pub fn user_properties(&self) -> Bytes {
        match read_prop_crc(&self.properties) {
            Some(_) => self.properties.slice(..self.properties.len() - PROP_CRC_LEN),
            None => self.properties.clone(),
        }
    }
}

struct Reader<'b> {
    buf: &'b [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], DecodeError> {
        let end = self.pos.checked_add(n).ok_or(DecodeError::Truncated)?;
        let s = self.buf.get(self.pos..end).ok_or(DecodeError::Truncated)?;
        self.pos = end;
        Ok(s)
    }
    fn arr<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.arr()?))
    }
    fn i32(&mut self) -> Result<i32, DecodeError> {
        Ok(i32::from_be_bytes(self.arr()?))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.arr()?))
    }
    fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_be_bytes(self.arr()?))
    }
    fn host(&mut self, v6: bool) -> Result<SocketAddr, DecodeError> {
        let ip: IpAddr = if v6 {
            IpAddr::from(self.arr::<16>()?)
        } else {
            IpAddr::from(self.arr::<4>()?)
        };
        let port = self.i32()?;
        Ok(SocketAddr::new(ip, port as u16))
    }
}

/// Who a stored record says it is, read straight from its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity<'a> {
    pub phys_offset: u64,
    pub queue_id: u32,
    pub queue_offset: u64,
    pub topic: &'a [u8],
}

/// Every field of a record and where its variable parts lie: what both
/// [`decode`] and [`verify`] read, parsed once, in one place.
struct Layout {
    total_size: u32,
    magic: u32,
    body_crc: u32,
    queue_id: u32,
    flag: i32,
    queue_offset: u64,
    phys_offset: u64,
    sys_flag: i32,
    born_timestamp: i64,
    born_host: SocketAddr,
    store_timestamp: i64,
    store_host: SocketAddr,
    reconsume_times: i32,
    prepared_transaction_offset: i64,
    body: std::ops::Range<usize>,
    topic: std::ops::Range<usize>,
    props: std::ops::Range<usize>,
}

fn layout(rec: &[u8]) -> Result<Layout, DecodeError> {
    let mut r = Reader { buf: rec, pos: 0 };
    let total_size = r.u32()?;
    if total_size as usize != rec.len() {
        return Err(DecodeError::SizeMismatch);
    }
    let magic = r.u32()?;
    if magic != MAGIC_V1 && magic != MAGIC_V2 {
        return Err(DecodeError::BadMagic(magic));
    }
    let body_crc = r.u32()?;
    let queue_id = r.u32()?;
    let flag = r.i32()?;
    let queue_offset = r.u64()?;
    let phys_offset = r.u64()?;
    let sys_flag = r.i32()?;
    let born_timestamp = r.i64()?;
    let born_host = r.host(sys_flag & sysflag::BORNHOST_V6 != 0)?;
    let store_timestamp = r.i64()?;
    let store_host = r.host(sys_flag & sysflag::STOREHOST_V6 != 0)?;
    let reconsume_times = r.i32()?;
    let prepared_transaction_offset = r.i64()?;
    let body_len = r.u32()? as usize;
    let body_at = r.pos;
    r.take(body_len)?;
    let topic_len = if magic == MAGIC_V2 {
        usize::from(u16::from_be_bytes(r.arr()?))
    } else {
        usize::from(r.arr::<1>()?[0])
    };
    let topic_at = r.pos;
    r.take(topic_len)?;
    let props_len = usize::from(u16::from_be_bytes(r.arr()?));
    let props_at = r.pos;
    r.take(props_len)?;
    if r.pos != rec.len() {
        return Err(DecodeError::SizeMismatch);
    }
    Ok(Layout {
        total_size,
        magic,
        body_crc,
        queue_id,
        flag,
        queue_offset,
        phys_offset,
        sys_flag,
        born_timestamp,
        born_host,
        store_timestamp,
        store_host,
        reconsume_times,
        prepared_transaction_offset,
        body: body_at..body_at + body_len,
        topic: topic_at..topic_at + topic_len,
        props: props_at..props_at + props_len,
    })
}

/// Checks a whole record without building a view (the read path's check):
/// its size and magic, the layout of every length, and the record-CRC
/// property over every other byte (which covers the body too). Returns who
/// the record says it is.
pub fn verify(rec: &[u8]) -> Result<Identity<'_>, DecodeError> {
    let l = layout(rec)?;
    let want = read_prop_crc(&rec[l.props.clone()]).ok_or(DecodeError::Crc)?;
    if crc32fast::hash(&rec[..rec.len() - PROP_CRC_LEN]) & 0x7FFF_FFFF != want {
        return Err(DecodeError::Crc);
    }
    Ok(Identity {
        phys_offset: l.phys_offset,
        queue_id: l.queue_id,
        queue_offset: l.queue_offset,
        topic: &rec[l.topic],
    })
}

/// Decodes a whole record (`rec` holds exactly TOTALSIZE bytes).
pub fn decode(rec: &Bytes) -> Result<MessageView, DecodeError> {
    let Layout {
        total_size,
        magic,
        body_crc,
        queue_id,
        flag,
        queue_offset,
        phys_offset,
        sys_flag,
        born_timestamp,
        born_host,
        store_timestamp,
        store_host,
        reconsume_times,
        prepared_transaction_offset,
        body,
        topic,
        props,
    } = layout(rec)?;
    Ok(MessageView {
        total_size,
        magic,
        body_crc,
        queue_id,
        flag,
        queue_offset,
        phys_offset,
        sys_flag,
        born_timestamp,
        born_host,
        store_timestamp,
        store_host,
        reconsume_times,
        prepared_transaction_offset,
        body: rec.slice(body),
        topic: rec.slice(topic),
        properties: rec.slice(props),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_decode_roundtrip_v4_and_v6() -> Result<(), DecodeError> {
        let props = properties::encode([("TAGS", "a"), ("KEYS", "k")]);
        for (born, store) in [("10.0.0.1:5000", "127.0.0.1:10911"), ("[::1]:6000", "[fe80::1]:10911")] {
            let born: SocketAddr = born.parse().map_err(|_| DecodeError::Truncated)?;
            let store: SocketAddr = store.parse().map_err(|_| DecodeError::Truncated)?;
            let mut m = MessageInput::new("TopicTest", 3, b"hello body", props.as_bytes());
            m.born_host = born;
            m.flag = 7;
            m.reconsume_times = 2;
            let len = encoded_len(&m, &store, true);
            let mut buf = vec![0u8; len];
            let at = Placement {
                queue_offset: 42,
                phys_offset: 1000,
                store_timestamp: 1_700_000_000_000,
                body_crc32: crc32fast::hash(m.body),
                record_crc: true,
            };
            encode(&mut buf, &m, &store, at);
            if born.is_ipv4() {
                // 91 + body + topic + props for IPv4 and v1 magic, + 20 for the CRC property.
                assert_eq!(len, 91 + 10 + 9 + props.len() + 20);
            }
            let rec = Bytes::from(buf.clone());
            let v = decode(&rec)?;
            assert!(v.record_crc_ok(&rec));
            assert_eq!(&v.user_properties()[..], props.as_bytes());
            // Every byte is covered by a CRC (or breaks the layout).
            for i in 0..buf.len() {
                let mut bad = buf.clone();
                bad[i] ^= 0x04;
                let bad = Bytes::from(bad);
                let caught = match decode(&bad) {
                    Ok(v) => !v.record_crc_ok(&bad),
                    Err(_) => true,
                };
                assert!(caught, "flip at byte {i} not detected");
            }
            assert_eq!(&v.body[..], b"hello body");
            assert_eq!(v.topic_str(), "TopicTest");
            assert_eq!(v.queue_id, 3);
            assert_eq!(v.flag, 7);
            assert_eq!(v.queue_offset, 42);
            assert_eq!(v.phys_offset, 1000);
            assert_eq!(v.born_host, born);
            assert_eq!(v.store_host, store);
            assert_eq!(v.reconsume_times, 2);
            assert_eq!(v.property("TAGS"), Some(&b"a"[..]));
            assert!(v.crc_ok());
        }
        Ok(())
    }

    #[test]
    fn long_topic_uses_v2_magic() -> Result<(), DecodeError> {
        let topic = "%RETRY%".to_string() + &"g".repeat(200);
        let m = MessageInput::new(&topic, 0, b"x", b"");
        let store: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 1));
        let mut buf = vec![0u8; encoded_len(&m, &store, false)];
        let at = Placement {
            queue_offset: 0,
            phys_offset: 0,
            store_timestamp: 1,
            body_crc32: crc32fast::hash(b"x"),
            record_crc: false,
        };
        encode(&mut buf, &m, &store, at);
        let v = decode(&Bytes::from(buf))?;
        assert_eq!(v.magic, MAGIC_V2);
        assert_eq!(v.topic_str(), topic);
        Ok(())
    }

    #[test]
    fn truncated_records_are_errors_not_panics() {
        let m = MessageInput::new("T", 0, b"abc", b"");
        let store = SocketAddr::from(([127, 0, 0, 1], 1));
        let mut buf = vec![0u8; encoded_len(&m, &store, true)];
        let at = Placement {
            queue_offset: 0,
            phys_offset: 0,
            store_timestamp: 1,
            body_crc32: 0,
            record_crc: true,
        };
        encode(&mut buf, &m, &store, at);
        for cut in 0..buf.len() {
            let b = Bytes::copy_from_slice(&buf[..cut]);
            assert!(decode(&b).is_err());
        }
    }
}
