//! One Kafka connection: length-prefixed frames in, responses out, in
//! request order (Kafka clients rely on it). Malformed or oversized frames
//! close this connection with one log line; others are unaffected.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::{Decodable, Encodable};
use rokka_broker::limits::ConnSlot;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, BufReader};
use tokio::sync::watch;

use crate::{api, versions, Endpoint, Kafka};

/// Why a connection is closed instead of answered.
#[derive(Debug)]
pub struct Close(pub String);

/// Serves one connection (a TCP stream, or TLS over one) of the listener
/// at `at`.
pub async fn run<S: AsyncRead + AsyncWrite + Send + 'static>(
    stream: S,
    peer: SocketAddr,
    k: Arc<Kafka>,
    at: Arc<Endpoint>,
    mut shutdown: watch::Receiver<bool>,
    _slot: ConnSlot,
    certificate_principal: Option<String>,
) {
    metrics::gauge!("rokka_kafka_connections").increment(1.0);
    let mut sasl = crate::sasl::Sasl::new(at.sasl);
    let mut who = crate::authz::Caller::new(peer.ip());
    // mTLS: the certificate's subject, until SASL (if any) names another.
    if let Some(p) = certificate_principal {
        who.set_principal(p);
    }
    let auth_deadline =
        tokio::time::Instant::now() + Duration::from_millis(k.config.sasl_authentication_timeout_ms.max(1));
    let (rd, mut wr) = tokio::io::split(stream);
    let mut rd = BufReader::with_capacity(64 * 1024, rd);
    let max = k.config.max_request_bytes as usize;
    let idle = Duration::from_millis(k.config.idle_timeout_ms.max(1));
    loop {
        // The idle clock runs from the last answered request to the end of
        // the next whole frame: a client that sends nothing, or a frame a
        // byte at a time, is closed after `idle_timeout_ms`.
        let mut deadline = tokio::time::Instant::now() + idle;
        // Before authentication on a SASL listener: small frames only
        // (Kafka's sasl.server.max.receive.size) and a deadline for the
        // whole exchange from the connection's start.
        let unauthenticated = !sasl.may_serve();
        if unauthenticated {
            deadline = deadline.min(auth_deadline);
        }
        let len = tokio::select! {
            r = tokio::time::timeout_at(deadline, rd.read_i32()) => match r {
                Ok(Ok(n)) => n,
                Ok(Err(_)) => break, // peer closed
                Err(_) => {
                    metrics::counter!("rokka_connections_idle_closed_total", "listener" => "kafka").increment(1);
                    tracing::debug!(%peer, "Kafka connection idle: closing");
                    break;
                }
            },
            _ = shutdown.changed() => break,
        };
        if unauthenticated && len as usize > crate::sasl::MAX_RECEIVE_BYTES {
            metrics::counter!("rokka_kafka_unauthenticated_requests_total").increment(1);
            tracing::debug!(%peer, len, "Kafka frame too large before SASL authentication: closing");
            break;
        }
        // After a SaslHandshake v0: the frame is a raw SASL token (any
        // length up to the pre-authentication cap, even empty).
        let raw = sasl.raw_tokens();
        if len < if raw { 0 } else { 8 } || len as usize > max {
            // (Anyone can open connections: counted, logged at most every 10 s.)
            metrics::counter!("rokka_kafka_bad_frames_total").increment(1);
            static LOG: rokka_broker::limits::LogEvery = rokka_broker::limits::LogEvery::new(10_000);
            if LOG.ready() {
                tracing::warn!(%peer, len, max, "Kafka frame length out of range: closing connection");
            }
            break;
        }
        // Reserve the frame's bytes from the listener's budget first; while
        // waiting this connection reads nothing (TCP pushes back).
        let reserved = tokio::select! {
            r = k.inflight.reserve(len as usize) => r,
            _ = shutdown.changed() => break,
        };
        // Read the frame as it arrives: memory follows the bytes received,
        // not the length the client declared.
        let mut buf = Vec::with_capacity((len as usize).min(64 * 1024));
        let read = tokio::time::timeout_at(deadline, (&mut rd).take(len as u64).read_to_end(&mut buf)).await;
        match read {
            Ok(Ok(n)) if n == len as usize => {}
            Ok(_) => break, // closed mid-frame
            Err(_) => {
                metrics::counter!("rokka_connections_idle_closed_total", "listener" => "kafka").increment(1);
                tracing::debug!(%peer, len, "Kafka frame not received within the idle timeout: closing");
                break;
            }
        }
        if raw {
            let Ok(r) = authenticate(&k, &mut sasl, &mut who, &buf).await else {
                break;
            };
            if sasl.failed() {
                // No error can be told in this form: Kafka closes the
                // connection (after the same delay).
                k.sasl_failures.failed(peer.ip());
                tokio::time::sleep(Duration::from_millis(k.config.sasl_failure_delay_ms)).await;
                tracing::debug!(%peer, "Kafka SASL (raw tokens) authentication failed: closing");
                break;
            }
            let mut out = Vec::with_capacity(4 + r.auth_bytes.len());
            out.extend_from_slice(&(r.auth_bytes.len() as i32).to_be_bytes());
            out.extend_from_slice(&r.auth_bytes);
            if !write_answer(&mut wr, &[out], idle, peer).await {
                break;
            }
            drop(reserved);
            continue;
        }
        match handle(&k, Bytes::from(buf), peer, &at, &mut sasl, &mut who).await {
            Ok(Some(chunks)) => {
                if sasl.failed() {
                    k.sasl_failures.failed(peer.ip());
                    // Answered late, then closed (Kafka's
                    // connection.failed.authentication.delay.ms).
                    tokio::time::sleep(Duration::from_millis(k.config.sasl_failure_delay_ms)).await;
                    write_answer(&mut wr, &chunks, idle, peer).await;
                    tracing::debug!(%peer, "Kafka SASL authentication failed: closing");
                    break;
                }
                if !write_answer(&mut wr, &chunks, idle, peer).await {
                    break;
                }
            }
            Ok(None) => {}
            // Counted, not logged per connection: anyone can reach a
            // SASL listener.
            Err(Close(why)) if !sasl.may_serve() => {
                tracing::debug!(%peer, why, "closing unauthenticated Kafka connection");
                break;
            }
            Err(Close(why)) => {
                tracing::warn!(%peer, why, "closing Kafka connection");
                break;
            }
        }
        drop(reserved);
    }
    metrics::gauge!("rokka_kafka_connections").decrement(1.0);
}

/// Writes an answer and flushes it (TLS holds what it encrypted until
/// flushed): false if the connection failed, or its client took no byte of
/// it for `idle` (a client that stopped reading, its socket buffer full,
/// would otherwise hold the connection, and the request bytes it reserved
/// from the listener's budget, for good). A slow reader that keeps reading
/// is not cut off.
async fn write_answer<W, C>(wr: &mut W, chunks: &[C], idle: Duration, peer: SocketAddr) -> bool
where
    W: tokio::io::AsyncWrite + Unpin,
    C: AsRef<[u8]>,
{
    use rokka_broker::limits::{write_with_progress, Written};
    match write_with_progress(wr, chunks, idle).await {
        Written::All => true,
        Written::Failed => false,
        Written::Stalled => {
            metrics::counter!("rokka_connections_write_stalled_total", "listener" => "kafka").increment(1);
            tracing::debug!(%peer, "Kafka client read none of its answer within the idle timeout: closing");
            false
        }
    }
}

fn api_name(key: ApiKey) -> &'static str {
    // Debug names are stable and short ("Produce", "Fetch", ...).
    match key {
        ApiKey::Produce => "Produce",
        ApiKey::Fetch => "Fetch",
        ApiKey::ListOffsets => "ListOffsets",
        ApiKey::Metadata => "Metadata",
        ApiKey::OffsetCommit => "OffsetCommit",
        ApiKey::OffsetFetch => "OffsetFetch",
        ApiKey::FindCoordinator => "FindCoordinator",
        ApiKey::JoinGroup => "JoinGroup",
        ApiKey::Heartbeat => "Heartbeat",
        ApiKey::LeaveGroup => "LeaveGroup",
        ApiKey::SyncGroup => "SyncGroup",
        ApiKey::DescribeGroups => "DescribeGroups",
        ApiKey::ListGroups => "ListGroups",
        ApiKey::ApiVersions => "ApiVersions",
        ApiKey::CreateTopics => "CreateTopics",
        ApiKey::DeleteTopics => "DeleteTopics",
        ApiKey::CreatePartitions => "CreatePartitions",
        ApiKey::InitProducerId => "InitProducerId",
        ApiKey::DeleteGroups => "DeleteGroups",
        ApiKey::DescribeConfigs => "DescribeConfigs",
        ApiKey::AlterConfigs => "AlterConfigs",
        ApiKey::ElectLeaders => "ElectLeaders",
        ApiKey::AlterPartitionReassignments => "AlterPartitionReassignments",
        ApiKey::ListPartitionReassignments => "ListPartitionReassignments",
        ApiKey::DescribeTopicPartitions => "DescribeTopicPartitions",
        ApiKey::DescribeLogDirs => "DescribeLogDirs",
        ApiKey::AlterReplicaLogDirs => "AlterReplicaLogDirs",
        ApiKey::OffsetForLeaderEpoch => "OffsetForLeaderEpoch",
        ApiKey::ConsumerGroupHeartbeat => "ConsumerGroupHeartbeat",
        ApiKey::ConsumerGroupDescribe => "ConsumerGroupDescribe",
        ApiKey::AddPartitionsToTxn => "AddPartitionsToTxn",
        ApiKey::AddOffsetsToTxn => "AddOffsetsToTxn",
        ApiKey::TxnOffsetCommit => "TxnOffsetCommit",
        ApiKey::EndTxn => "EndTxn",
        ApiKey::DescribeTransactions => "DescribeTransactions",
        ApiKey::ListTransactions => "ListTransactions",
        ApiKey::DescribeProducers => "DescribeProducers",
        ApiKey::IncrementalAlterConfigs => "IncrementalAlterConfigs",
        ApiKey::DescribeCluster => "DescribeCluster",
        ApiKey::DeleteRecords => "DeleteRecords",
        ApiKey::OffsetDelete => "OffsetDelete",
        ApiKey::SaslHandshake => "SaslHandshake",
        ApiKey::SaslAuthenticate => "SaslAuthenticate",
        ApiKey::DescribeUserScramCredentials => "DescribeUserScramCredentials",
        ApiKey::AlterUserScramCredentials => "AlterUserScramCredentials",
        ApiKey::DescribeAcls => "DescribeAcls",
        ApiKey::CreateAcls => "CreateAcls",
        ApiKey::DeleteAcls => "DeleteAcls",
        _ => "other",
    }
}

/// Decodes a whole request frame (API key, version, header, body) as
/// [`handle`] does: an unknown key, an unserved version, malformed bytes or
/// a decoder panic is an error. For the fuzz targets (`fuzz/`).
pub fn decode_request(frame: Bytes) -> Result<(RequestHeader, RequestKind), String> {
    let Some(&[k0, k1, v0, v1]) = frame.get(..4) else {
        return Err(format!("frame of {} bytes has no request header", frame.len()));
    };
    let key_raw = i16::from_be_bytes([k0, k1]);
    let version = i16::from_be_bytes([v0, v1]);
    let key = ApiKey::try_from(key_raw).map_err(|_| format!("unknown API key {key_raw}"))?;
    if !versions::served(key, version) {
        return Err(format!("{key:?} v{version} is not served"));
    }
    decode_body(key, version, frame)
}

/// The request header and body of a frame of a served `key` and `version`.
fn decode_body(key: ApiKey, version: i16, mut frame: Bytes) -> Result<(RequestHeader, RequestKind), String> {
    let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let header = RequestHeader::decode(&mut frame, key.request_header_version(version))?;
        let req = RequestKind::decode(key, &mut frame, version)?;
        Ok::<_, anyhow::Error>((header, req))
    }));
    match decoded {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("malformed {key:?} v{version}: {e}")),
        Err(_) => Err(format!("malformed {key:?} v{version} (decoder panicked)")),
    }
}

/// Decodes, dispatches and encodes one request. `Ok(None)` = no response
/// (acks=0 produce).
pub async fn handle(
    k: &Kafka,
    frame: Bytes,
    peer: SocketAddr,
    at: &Endpoint,
    sasl: &mut crate::sasl::Sasl,
    who: &mut crate::authz::Caller,
) -> Result<Option<Vec<Bytes>>, Close> {
    let key_raw = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let correlation_id = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
    let Ok(key) = ApiKey::try_from(key_raw) else {
        return Err(Close(format!("unknown API key {key_raw}")));
    };
    let name = api_name(key);
    rokka_broker::hot_metrics::count("rokka_kafka_requests_total", "api", name, 1);
    if !versions::served(key, version) {
        metrics::counter!("rokka_kafka_errors_total", "api" => name, "code" => "35").increment(1);
        return match api::unsupported_version_response(key, version) {
            // An ApiVersions request of an unknown version is answered in v0
            // (KIP-511), which every client can read; others in their own.
            Some(resp) => {
                let v = if key == ApiKey::ApiVersions { 0 } else { version };
                encode_response(key, v, correlation_id, &resp).map(|b| Some(vec![b]))
            }
            None => Err(Close(format!(
                "{key:?} v{version} is not supported and has no error response form"
            ))),
        };
    }
    // A SASL listener serves nothing but these before authentication (a
    // client that sends more is closed, as Kafka closes it).
    if !sasl.may_serve()
        && !matches!(
            key,
            ApiKey::ApiVersions | ApiKey::SaslHandshake | ApiKey::SaslAuthenticate
        )
    {
        metrics::counter!("rokka_kafka_unauthenticated_requests_total").increment(1);
        return Err(Close(format!("{key:?} before SASL authentication")));
    }
    let started = std::time::Instant::now();
    let (header, req) = decode_body(key, version, frame).map_err(Close)?;
    let resp = match req {
        RequestKind::SaslHandshake(r) => Some(api::Response::Kind(ResponseKind::SaslHandshake(sasl.handshake(
            k,
            r.mechanism.as_str(),
            version,
        )))),
        RequestKind::SaslAuthenticate(r) => Some(api::Response::Kind(ResponseKind::SaslAuthenticate(
            authenticate(k, sasl, who, &r.auth_bytes).await?,
        ))),
        req => api::dispatch(k, &header, req, version, peer, at, who).await?,
    };
    rokka_broker::hot_metrics::record(
        "rokka_kafka_request_seconds",
        "api",
        name,
        started.elapsed().as_secs_f64(),
    );
    match resp {
        Some(api::Response::Kind(r)) => {
            crate::errors::count(name, &r);
            encode_response(key, version, correlation_id, &r).map(|b| Some(vec![b]))
        }
        Some(api::Response::Fetch(f)) => Ok(Some(api::encode_fetch(&f, version, correlation_id))),
        None => Ok(None),
    }
}

/// One SASL step (a SaslAuthenticate's bytes, or a raw token after a v0
/// handshake): PBKDF2 for PLAIN a bounded number at once, off the
/// runtime's threads; an authenticated user becomes the caller.
async fn authenticate(
    k: &Kafka,
    sasl: &mut crate::sasl::Sasl,
    who: &mut crate::authz::Caller,
    bytes: &[u8],
) -> Result<kafka_protocol::messages::SaslAuthenticateResponse, Close> {
    let _permit = k
        .sasl_checks
        .acquire()
        .await
        .map_err(|_| Close("shutting down".into()))?;
    let r = rokka_broker::offload(|| sasl.authenticate(k, bytes));
    if let Some(user) = sasl.principal() {
        who.authenticated(user);
    }
    Ok(r)
}

pub fn encode_response(key: ApiKey, version: i16, correlation_id: i32, resp: &ResponseKind) -> Result<Bytes, Close> {
    let mut out = BytesMut::with_capacity(256);
    out.put_i32(0);
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    header
        .encode(&mut out, key.response_header_version(version))
        .map_err(|e| Close(format!("encoding response header: {e}")))?;
    resp.encode(&mut out, version)
        .map_err(|e| Close(format!("encoding {key:?} v{version} response: {e}")))?;
    let n = (out.len() - 4) as i32;
    out[0..4].copy_from_slice(&n.to_be_bytes());
    Ok(out.freeze())
}
