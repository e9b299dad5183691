//! A small blocking Kafka client for the admin commands: one request at a
//! time over the node's own Kafka listener (as `rpk` talks to a broker),
//! optionally SASL PLAIN. Connections per broker address are kept for the
//! command's life.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::*;
use kafka_protocol::messages::{list_offsets_request::*, metadata_request::*};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use kafka_protocol::ResponseError;

/// What failed, for the operator (exit code 2 unless it is a refusal).
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("cannot reach {0}: {1}")]
    Connect(String, std::io::Error),
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error("{0}")]
    Protocol(String),
    /// A request the command cannot make (exit code 2).
    #[error("{0}")]
    Usage(String),
    /// The broker refused (exit code 1).
    #[error("{0}")]
    Refused(String),
}

pub type Result<T> = std::result::Result<T, AdminError>;

/// A Kafka error code's name (`UNKNOWN_TOPIC_OR_PARTITION`), or its number.
pub fn error_name(code: i16) -> String {
    match ResponseError::try_from_code(code) {
        Some(e) if !matches!(e, ResponseError::Unknown(_)) => {
            let camel = format!("{e:?}");
            let mut out = String::with_capacity(camel.len() + 8);
            for (i, c) in camel.chars().enumerate() {
                if c.is_ascii_uppercase() && i > 0 {
                    out.push('_');
                }
                out.push(c.to_ascii_uppercase());
            }
            out
        }
        _ => format!("error {code}"),
    }
}

/// Err(Refused) naming `what` unless `code` is 0.
pub fn check(code: i16, message: Option<&StrBytes>, what: &str) -> Result<()> {
    if code == 0 {
        return Ok(());
    }
    let detail = message.map(|m| format!(": {m}")).unwrap_or_default();
    Err(AdminError::Refused(format!("{what}: {}{detail}", error_name(code))))
}

pub fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// SASL PLAIN credentials.
#[derive(Debug, Clone)]
pub struct Credentials {
    pub user: String,
    pub password: String,
}

pub struct Client {
    /// The addresses given (comma-separated `--brokers`); the first that
    /// answers is the bootstrap broker.
    seeds: Vec<String>,
    bootstrap: String,
    credentials: Option<Credentials>,
    conns: HashMap<String, TcpStream>,
    correlation: i32,
}

const TIMEOUT: Duration = Duration::from_secs(30);

impl Client {
    pub fn new(brokers: &str, credentials: Option<Credentials>) -> Client {
        let seeds: Vec<String> = brokers
            .split(',')
            .map(|a| a.trim().to_string())
            .filter(|a| !a.is_empty())
            .collect();
        Client {
            bootstrap: seeds.first().cloned().unwrap_or_else(|| "127.0.0.1:9092".to_string()),
            seeds,
            credentials,
            conns: HashMap::new(),
            correlation: 0,
        }
    }

    /// Connects to the first seed that answers.
    fn bootstrap_conn(&mut self) -> Result<String> {
        if self.conns.contains_key(&self.bootstrap) {
            return Ok(self.bootstrap.clone());
        }
        let mut last = None;
        for seed in self.seeds.clone() {
            match self.conn(&seed) {
                Ok(_) => {
                    self.bootstrap = seed.clone();
                    return Ok(seed);
                }
                Err(e @ AdminError::Connect(..)) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| AdminError::Protocol("no broker address given (--brokers)".into())))
    }

    fn conn(&mut self, addr: &str) -> Result<&mut TcpStream> {
        if !self.conns.contains_key(addr) {
            let s = super::connect(addr).map_err(|e| AdminError::Connect(addr.to_string(), e))?;
            let io = |e| AdminError::Io(addr.to_string(), e);
            s.set_read_timeout(Some(TIMEOUT)).map_err(io)?;
            s.set_write_timeout(Some(TIMEOUT)).map_err(io)?;
            s.set_nodelay(true).map_err(io)?;
            self.conns.insert(addr.to_string(), s);
            if let Some(c) = self.credentials.clone() {
                self.authenticate(addr, &c)?;
            }
        }
        self.conns
            .get_mut(addr)
            .ok_or_else(|| AdminError::Protocol(format!("no connection to {addr}")))
    }

    fn authenticate(&mut self, addr: &str, c: &Credentials) -> Result<()> {
        let hs: SaslHandshakeResponse = self.call_at(
            addr,
            ApiKey::SaslHandshake,
            1,
            &SaslHandshakeRequest::default().with_mechanism(s("PLAIN")),
        )?;
        check(hs.error_code, None, "SASL PLAIN")?;
        let token = format!("\0{}\0{}", c.user, c.password);
        let r: SaslAuthenticateResponse = self.call_at(
            addr,
            ApiKey::SaslAuthenticate,
            2,
            &SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(token)),
        )?;
        check(
            r.error_code,
            r.error_message.as_ref(),
            &format!("logging in as {}", c.user),
        )
    }

    /// One request to the bootstrap broker.
    pub fn call<Req: Encodable + HeaderVersion, Resp: Decodable + HeaderVersion>(
        &mut self,
        key: ApiKey,
        version: i16,
        req: &Req,
    ) -> Result<Resp> {
        let addr = self.bootstrap_conn()?;
        self.call_at(&addr, key, version, req)
    }

    /// One request to the broker at `addr`.
    pub fn call_at<Req: Encodable + HeaderVersion, Resp: Decodable + HeaderVersion>(
        &mut self,
        addr: &str,
        key: ApiKey,
        version: i16,
        req: &Req,
    ) -> Result<Resp> {
        self.correlation += 1;
        let correlation = self.correlation;
        let proto = |e: anyhow_like::E| AdminError::Protocol(format!("{key:?} v{version}: {e}"));
        let mut buf = BytesMut::new();
        buf.put_i32(0);
        RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(correlation)
            .with_client_id(Some(StrBytes::from_static_str("rokka-admin")))
            .encode(&mut buf, Req::header_version(version))
            .map_err(|e| proto(anyhow_like::e(e)))?;
        req.encode(&mut buf, version).map_err(|e| proto(anyhow_like::e(e)))?;
        let n = (buf.len() - 4) as i32;
        buf[0..4].copy_from_slice(&n.to_be_bytes());
        let io = |e| AdminError::Io(addr.to_string(), e);
        let s = self.conn(addr)?;
        let sent = s.write_all(&buf);
        if sent.is_err() {
            self.conns.remove(addr);
        }
        sent.map_err(io)?;
        let s = self.conn(addr)?;
        let mut len = [0u8; 4];
        s.read_exact(&mut len).map_err(io)?;
        let len = i32::from_be_bytes(len);
        if !(0..=256 << 20).contains(&len) {
            return Err(AdminError::Protocol(format!("{key:?}: a response of {len} bytes")));
        }
        let mut resp = vec![0u8; len as usize];
        s.read_exact(&mut resp).map_err(io)?;
        let mut b = Bytes::from(resp);
        let h = ResponseHeader::decode(&mut b, Resp::header_version(version)).map_err(|e| proto(anyhow_like::e(e)))?;
        if h.correlation_id != correlation {
            return Err(AdminError::Protocol(format!(
                "{key:?}: answer {} to request {correlation}",
                h.correlation_id
            )));
        }
        Resp::decode(&mut b, version).map_err(|e| proto(anyhow_like::e(e)))
    }

    /// Metadata of `topics` (None: every topic), never creating one.
    pub fn metadata(&mut self, topics: Option<&[String]>) -> Result<MetadataResponse> {
        let req = MetadataRequest::default()
            .with_allow_auto_topic_creation(false)
            .with_topics(topics.map(|ts| {
                ts.iter()
                    .map(|t| MetadataRequestTopic::default().with_name(Some(TopicName(s(t)))))
                    .collect()
            }));
        self.call(ApiKey::Metadata, 12, &req)
    }

    /// The broker address of each node id in `m`.
    pub fn brokers(m: &MetadataResponse) -> HashMap<i32, String> {
        m.brokers
            .iter()
            .map(|b| (b.node_id.0, format!("{}:{}", b.host, b.port)))
            .collect()
    }

    /// The offsets at `timestamp` (-2 earliest, -1 latest) of each
    /// (topic, partition), asked of each partition's leader.
    pub fn list_offsets(
        &mut self,
        m: &MetadataResponse,
        parts: &[(String, i32)],
        timestamp: i64,
    ) -> Result<HashMap<(String, i32), i64>> {
        let brokers = Self::brokers(m);
        // (topic, partition) → leader, looked up once per partition.
        let leaders: HashMap<(&str, i32), i32> = m
            .topics
            .iter()
            .filter_map(|x| x.name.as_ref().map(|n| (n.0.as_str(), x)))
            .flat_map(|(n, x)| {
                x.partitions
                    .iter()
                    .map(move |q| ((n, q.partition_index), q.leader_id.0))
            })
            .collect();
        let mut by_leader: HashMap<String, Vec<(String, i32)>> = HashMap::new();
        for (t, p) in parts {
            let leader = leaders
                .get(&(t.as_str(), *p))
                .and_then(|l| brokers.get(l).cloned())
                .unwrap_or_else(|| self.bootstrap.clone());
            by_leader.entry(leader).or_default().push((t.clone(), *p));
        }
        // A partition that cannot be answered (no leader during a
        // failover, a broker out of reach) is left out — the caller shows
        // it empty — unless none could be: then the first error.
        let mut out = HashMap::new();
        let mut first_err = None;
        for (addr, parts) in by_leader {
            let mut topics: Vec<ListOffsetsTopic> = Vec::new();
            let mut index: HashMap<&str, usize> = HashMap::new();
            for (t, p) in &parts {
                let part = ListOffsetsPartition::default()
                    .with_partition_index(*p)
                    .with_timestamp(timestamp)
                    .with_current_leader_epoch(-1);
                match index.get(t.as_str()) {
                    Some(&i) => topics[i].partitions.push(part),
                    None => {
                        index.insert(t.as_str(), topics.len());
                        topics.push(
                            ListOffsetsTopic::default()
                                .with_name(TopicName(s(t)))
                                .with_partitions(vec![part]),
                        );
                    }
                }
            }
            let req = ListOffsetsRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_topics(topics);
            let r: ListOffsetsResponse = match self.call_at(&addr, ApiKey::ListOffsets, 7, &req) {
                Ok(r) => r,
                Err(e) => {
                    first_err.get_or_insert(e);
                    continue;
                }
            };
            for t in r.topics {
                for p in t.partitions {
                    match check(
                        p.error_code,
                        None,
                        &format!("offsets of {}/{}", t.name.0, p.partition_index),
                    ) {
                        Ok(()) => {
                            out.insert((t.name.0.to_string(), p.partition_index), p.offset);
                        }
                        Err(e) => {
                            first_err.get_or_insert(e);
                        }
                    }
                }
            }
        }
        match first_err {
            Some(e) if out.is_empty() && !parts.is_empty() => Err(e),
            _ => Ok(out),
        }
    }

    /// The address of `group`'s coordinator.
    pub fn coordinator(&mut self, group: &str) -> Result<String> {
        let req = FindCoordinatorRequest::default()
            .with_key_type(0)
            .with_coordinator_keys(vec![s(group)]);
        let r: FindCoordinatorResponse = self.call(ApiKey::FindCoordinator, 4, &req)?;
        let c = r
            .coordinators
            .into_iter()
            .next()
            .ok_or_else(|| AdminError::Protocol("FindCoordinator answered no coordinator".into()))?;
        check(
            c.error_code,
            c.error_message.as_ref(),
            &format!("coordinator of {group}"),
        )?;
        Ok(format!("{}:{}", c.host, c.port))
    }
}

/// Encode/decode errors of kafka-protocol as one displayable type.
mod anyhow_like {
    pub struct E(pub String);
    impl std::fmt::Display for E {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&self.0)
        }
    }
    pub fn e(e: impl std::fmt::Display) -> E {
        E(e.to_string())
    }
}
