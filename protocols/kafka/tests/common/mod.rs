//! Helpers the in-process Kafka tests share: one request/response over a
//! raw connection with our own codec, and whether the server closed it.
#![allow(dead_code)]

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sends `req` as `key` v`version` and decodes the answer.
pub async fn call<Req: Encodable, Resp: Decodable>(
    s: &mut TcpStream,
    key: ApiKey,
    version: i16,
    req: &Req,
) -> Result<Resp, Box<dyn std::error::Error>> {
    let mut buf = BytesMut::new();
    buf.put_i32(0);
    RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(7)
        .with_client_id(Some(StrBytes::from_static_str("wire-test")))
        .encode(&mut buf, key.request_header_version(version))?;
    req.encode(&mut buf, version)?;
    let n = (buf.len() - 4) as i32;
    buf[0..4].copy_from_slice(&n.to_be_bytes());
    s.write_all(&buf).await?;
    let len = s.read_i32().await? as usize;
    let mut resp = vec![0u8; len];
    s.read_exact(&mut resp).await?;
    let mut b = Bytes::from(resp);
    let h = ResponseHeader::decode(&mut b, key.response_header_version(version))?;
    assert_eq!(h.correlation_id, 7);
    Ok(Resp::decode(&mut b, version)?)
}

/// Whether the server closed `s` (a read gets end of stream within 5 s).
pub async fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    matches!(
        tokio::time::timeout(std::time::Duration::from_secs(5), s.read(&mut b)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

/// A Kafka listener (plaintext, default config) on a free loopback port in
/// front of `broker`: its address, and the sender that stops it.
pub async fn serve(
    broker: std::sync::Arc<rokka_broker::Broker>,
) -> Result<(std::net::SocketAddr, tokio::sync::watch::Sender<bool>), Box<dyn std::error::Error>> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let kafka = std::sync::Arc::new(rokka_kafka::Kafka::new(
        broker,
        rokka_kafka::KafkaConfig::default(),
        rokka_group::GroupConfig::default(),
        addr,
    ));
    let (tx, rx) = tokio::sync::watch::channel(false);
    rokka_kafka::spawn_background(&kafka, &rx);
    let at = kafka.plaintext();
    tokio::spawn(rokka_kafka::serve(listener, kafka, at, None, rx));
    Ok((addr, tx))
}
