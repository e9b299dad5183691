//! A small blocking RocketMQ remoting client for the message and DLQ
//! commands: routes from the name server, pulls (no commit), queries by key
//! and id, sends. Requests are signed (AccessKey / SecretKey, RocketMQ's ACL
//! signature) when credentials are given.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use base64::Engine;
use bytes::{Buf, Bytes, BytesMut};
use rokka_remoting::{decode, encode, RemotingCommand, DEFAULT_MAX_FRAME};
use rokka_store::MessageView;
use serde_json::Value;

use super::kafka::{AdminError, Credentials, Result};

const TIMEOUT: Duration = Duration::from_secs(30);

pub const SUCCESS: i32 = 0;
pub const PULL_NOT_FOUND: i32 = 19;
pub const PULL_RETRY_IMMEDIATELY: i32 = 20;
pub const PULL_OFFSET_MOVED: i32 = 21;
pub const QUERY_NOT_FOUND: i32 = 22;

pub mod code {
    pub const SEND_MESSAGE: i32 = 10;
    pub const PULL_MESSAGE: i32 = 11;
    pub const QUERY_MESSAGE: i32 = 12;
    pub const SEARCH_OFFSET_BY_TIMESTAMP: i32 = 29;
    pub const GET_MAX_OFFSET: i32 = 30;
    pub const GET_MIN_OFFSET: i32 = 31;
    pub const VIEW_MESSAGE_BY_ID: i32 = 33;
    pub const GET_BROKER_CLUSTER_INFO: i32 = 106;
    pub const GET_ROUTEINFO_BY_TOPIC: i32 = 105;
    pub const INVOKE_BROKER_TO_RESET_OFFSET: i32 = 222;
    pub const QUERY_TOPIC_CONSUME_BY_WHO: i32 = 300;
}

/// One broker (set master) serving a topic, and its queue counts.
#[derive(Debug, Clone)]
pub struct BrokerQueues {
    pub name: String,
    pub addr: String,
    pub read_queues: u32,
    pub write_queues: u32,
}

pub struct Remoting {
    namesrv: Vec<String>,
    credentials: Option<Credentials>,
    conns: HashMap<String, (TcpStream, BytesMut)>,
    opaque: i32,
}

/// fastjson writes integer map keys bare (`{0:"host:port"}`); quote them
/// so serde_json reads Apache name servers' routes too.
fn quote_bare_keys(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 16);
    let (mut in_str, mut escaped, mut expect_key) = (false, false, false);
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if in_str {
            out.push(c);
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => {
                in_str = true;
                expect_key = false;
                out.push(c);
            }
            '{' | ',' => {
                expect_key = true;
                out.push(c);
            }
            c if expect_key && (c.is_ascii_digit() || c == '-') => {
                let mut key = String::from(c);
                while let Some(&d) = chars.peek() {
                    if d.is_ascii_digit() {
                        key.push(d);
                        chars.next();
                    } else {
                        break;
                    }
                }
                let mut ws = String::new();
                while let Some(&d) = chars.peek() {
                    if d.is_whitespace() {
                        ws.push(d);
                        chars.next();
                    } else {
                        break;
                    }
                }
                if chars.peek() == Some(&':') {
                    out.push('"');
                    out.push_str(&key);
                    out.push('"');
                } else {
                    out.push_str(&key);
                }
                out.push_str(&ws);
                expect_key = false;
            }
            c if c.is_whitespace() => out.push(c),
            _ => {
                expect_key = false;
                out.push(c);
            }
        }
    }
    out
}

impl Remoting {
    pub fn new(namesrv: &str, credentials: Option<Credentials>) -> Remoting {
        Remoting {
            namesrv: namesrv
                .split([',', ';'])
                .map(|a| a.trim().to_string())
                .filter(|a| !a.is_empty())
                .collect(),
            credentials,
            conns: HashMap::new(),
            opaque: 0,
        }
    }

    /// One request to `addr`; its response.
    pub fn call(&mut self, addr: &str, mut cmd: RemotingCommand) -> Result<RemotingCommand> {
        self.opaque += 1;
        cmd.opaque = self.opaque;
        if let Some(c) = &self.credentials {
            cmd.ext_fields.set("AccessKey", c.user.clone());
            let mut fields: Vec<_> = cmd.ext_fields.0.iter().collect();
            fields.sort_by(|a, b| a.0.cmp(&b.0));
            let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, c.password.as_bytes());
            let mut ctx = ring::hmac::Context::with_key(&key);
            for (_, v) in fields {
                ctx.update(v.as_bytes());
            }
            ctx.update(&cmd.body);
            let sig = base64::engine::general_purpose::STANDARD.encode(ctx.sign().as_ref());
            cmd.ext_fields.set("Signature", sig);
        }
        let io = |e| AdminError::Io(addr.to_string(), e);
        if !self.conns.contains_key(addr) {
            let s = super::connect(addr).map_err(|e| AdminError::Connect(addr.to_string(), e))?;
            s.set_read_timeout(Some(TIMEOUT)).map_err(io)?;
            s.set_write_timeout(Some(TIMEOUT)).map_err(io)?;
            s.set_nodelay(true).map_err(io)?;
            self.conns.insert(addr.to_string(), (s, BytesMut::new()));
        }
        let Some((s, buf)) = self.conns.get_mut(addr) else {
            return Err(AdminError::Protocol(format!("no connection to {addr}")));
        };
        let mut out = BytesMut::new();
        encode(&cmd, &mut out);
        s.write_all(&out).map_err(io)?;
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            match decode(buf, DEFAULT_MAX_FRAME) {
                Ok(Some(r)) if r.is_response() && r.opaque == cmd.opaque => return Ok(r),
                Ok(Some(_)) => continue,
                Ok(None) => {}
                Err(e) => return Err(AdminError::Protocol(format!("{addr}: {e}"))),
            }
            let n = s.read(&mut chunk).map_err(io)?;
            if n == 0 {
                self.conns.remove(addr);
                return Err(AdminError::Protocol(format!("{addr} closed the connection")));
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// A request with `fields`, answered SUCCESS (else Refused naming `what`).
    pub fn ok(&mut self, addr: &str, code: i32, fields: &[(&str, String)], what: &str) -> Result<RemotingCommand> {
        let r = self.call(addr, request(code, fields))?;
        if r.code != SUCCESS {
            return Err(refused(&r, what));
        }
        Ok(r)
    }

    /// The masters serving `topic`, per the name server.
    pub fn route(&mut self, topic: &str) -> Result<Vec<BrokerQueues>> {
        let mut last = None;
        for ns in self.namesrv.clone() {
            match self.call(
                &ns,
                request(code::GET_ROUTEINFO_BY_TOPIC, &[("topic", topic.to_string())]),
            ) {
                Ok(r) if r.code == SUCCESS => return parse_route(&r.body),
                Ok(r) => return Err(refused(&r, &format!("route of {topic}"))),
                Err(e @ AdminError::Connect(..)) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| AdminError::Usage("no name server address given (--namesrv)".into())))
    }

    /// Every broker address the name server lists (GET_BROKER_CLUSTER_INFO),
    /// masters and replicas.
    pub fn broker_addrs(&mut self) -> Result<Vec<String>> {
        let mut last = None;
        for ns in self.namesrv.clone() {
            match self.call(&ns, request(code::GET_BROKER_CLUSTER_INFO, &[])) {
                Ok(r) if r.code == SUCCESS => {
                    let text = String::from_utf8_lossy(&r.body);
                    let v: Value = serde_json::from_str(&text)
                        .or_else(|_| serde_json::from_str(&quote_bare_keys(&text)))
                        .map_err(|e| AdminError::Protocol(format!("the cluster the name server sent: {e}")))?;
                    let mut out: Vec<String> = v["brokerAddrTable"]
                        .as_object()
                        .into_iter()
                        .flat_map(|t| t.values())
                        .filter_map(|b| b["brokerAddrs"].as_object())
                        .flat_map(|a| a.values())
                        .filter_map(|a| a.as_str().map(str::to_string))
                        .collect();
                    out.sort();
                    out.dedup();
                    return Ok(out);
                }
                Ok(r) => return Err(refused(&r, "the cluster's brokers")),
                Err(e @ AdminError::Connect(..)) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| AdminError::Usage("no name server address given (--namesrv)".into())))
    }

    /// The offset answered by GET_MIN_OFFSET / GET_MAX_OFFSET /
    /// SEARCH_OFFSET_BY_TIMESTAMP.
    pub fn offset(&mut self, addr: &str, code: i32, topic: &str, queue: u32, timestamp: Option<i64>) -> Result<i64> {
        let mut fields = vec![("topic", topic.to_string()), ("queueId", queue.to_string())];
        if let Some(ts) = timestamp {
            fields.push(("timestamp", ts.to_string()));
        }
        let r = self.ok(addr, code, &fields, &format!("offsets of {topic}/{queue}"))?;
        r.ext_fields
            .get("offset")
            .and_then(|o| o.parse().ok())
            .ok_or_else(|| AdminError::Protocol(format!("{addr}: an offset answer without an offset")))
    }

    /// Up to `max` messages of (topic, queue) from `offset`, read for
    /// `group` without committing anything.
    pub fn pull(
        &mut self,
        addr: &str,
        group: &str,
        topic: &str,
        queue: u32,
        offset: i64,
        max: u32,
    ) -> Result<Vec<MessageView>> {
        self.pull_next(addr, group, topic, queue, offset, max).map(|(m, _)| m)
    }

    /// [`RemotingClient::pull`], and where the broker says to read next
    /// (`nextBeginOffset`): past messages a read skipped (aborted Kafka
    /// transactions, filtered ones) or, for an offset retention passed
    /// (PULL_OFFSET_MOVED), the queue's first.
    pub fn pull_next(
        &mut self,
        addr: &str,
        group: &str,
        topic: &str,
        queue: u32,
        offset: i64,
        max: u32,
    ) -> Result<(Vec<MessageView>, Option<i64>)> {
        let fields = [
            ("consumerGroup", group.to_string()),
            ("topic", topic.to_string()),
            ("queueId", queue.to_string()),
            ("queueOffset", offset.to_string()),
            ("maxMsgNums", max.to_string()),
            // Subscription in the request; no commit, no long poll.
            ("sysFlag", "4".to_string()),
            ("commitOffset", "0".to_string()),
            ("suspendTimeoutMillis", "0".to_string()),
            ("subscription", "*".to_string()),
            ("subVersion", "0".to_string()),
            ("expressionType", "TAG".to_string()),
        ];
        let r = self.call(addr, request(code::PULL_MESSAGE, &fields))?;
        let next = r.ext_fields.get("nextBeginOffset").and_then(|v| v.parse::<i64>().ok());
        match r.code {
            SUCCESS => Ok((messages(&r.body)?, next)),
            PULL_NOT_FOUND | PULL_RETRY_IMMEDIATELY | PULL_OFFSET_MOVED => Ok((Vec::new(), next)),
            _ => Err(refused(&r, &format!("reading {topic}/{queue} at {offset}"))),
        }
    }
}

pub fn request(code: i32, fields: &[(&str, String)]) -> RemotingCommand {
    let mut cmd = RemotingCommand::request(code, 0);
    for (k, v) in fields {
        cmd.ext_fields.set(k, v.clone());
    }
    cmd
}

pub fn refused(r: &RemotingCommand, what: &str) -> AdminError {
    AdminError::Refused(format!(
        "{what}: response code {}{}",
        r.code,
        r.remark.as_ref().map(|m| format!(" ({m})")).unwrap_or_default()
    ))
}

fn parse_route(body: &[u8]) -> Result<Vec<BrokerQueues>> {
    let text = String::from_utf8_lossy(body);
    let v: Value = serde_json::from_str(&text)
        .or_else(|_| serde_json::from_str(&quote_bare_keys(&text)))
        .map_err(|e| AdminError::Protocol(format!("a route the name server sent: {e}")))?;
    let mut out = Vec::new();
    for q in v["queueDatas"].as_array().into_iter().flatten() {
        let name = q["brokerName"].as_str().unwrap_or_default();
        let addr = v["brokerDatas"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|b| b["brokerName"].as_str() == Some(name))
            .and_then(|b| b["brokerAddrs"]["0"].as_str());
        if let Some(addr) = addr {
            out.push(BrokerQueues {
                name: name.to_string(),
                addr: addr.to_string(),
                read_queues: q["readQueueNums"].as_u64().unwrap_or(0) as u32,
                write_queues: q["writeQueueNums"].as_u64().unwrap_or(0) as u32,
            });
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// The stored messages of a pull or query answer, one after another.
pub fn messages(body: &Bytes) -> Result<Vec<MessageView>> {
    let mut out = Vec::new();
    let mut rest = body.clone();
    while rest.len() >= 4 {
        let size = (&rest[..4]).get_u32() as usize;
        if size < 4 || size > rest.len() {
            return Err(AdminError::Protocol(format!(
                "a message of {size} bytes in an answer of {}",
                rest.len()
            )));
        }
        let rec = rest.split_to(size);
        let m = rokka_store::record::message::decode(&rec)
            .map_err(|e| AdminError::Protocol(format!("a message the broker sent: {e:?}")))?;
        out.push(m);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_integer_keys_are_quoted() {
        let s = r#"{"brokerDatas":[{"brokerAddrs":{0:"h:1", 1 :"h:2"},"brokerName":"b,{0:"}],"n":-1}"#;
        let v: Value = serde_json::from_str(&quote_bare_keys(s)).expect("valid JSON");
        assert_eq!(v["brokerDatas"][0]["brokerAddrs"]["1"], "h:2");
        assert_eq!(v["brokerDatas"][0]["brokerName"], "b,{0:");
        assert_eq!(v["n"], -1);
    }

    #[test]
    fn routes_name_each_master() {
        let body = br#"{"brokerDatas":[{"brokerAddrs":{0:"127.0.0.1:10911"},"brokerName":"broker-a","cluster":"c"}],"queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":2}]}"#;
        let r = parse_route(body).expect("parses");
        assert_eq!(r.len(), 1);
        assert_eq!(
            (r[0].addr.as_str(), r[0].read_queues, r[0].write_queues),
            ("127.0.0.1:10911", 4, 2)
        );
    }
}
