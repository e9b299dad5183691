//! In-process SASL checks with our own codec and our own SCRAM client math
//! (in addition to librdkafka, kafka-python and kafkajs in
//! compat-tests/kafka): a SASL listener refuses requests before
//! authentication, SCRAM-SHA-256 completes with the server's signature
//! verified, a wrong proof and a wrong PLAIN password fail and close, and a
//! second SaslAuthenticate after success is refused.

use std::sync::Arc;

use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use rokka_broker::users::{b64, unb64, Mechanism};
use rokka_broker::{Broker, BrokerConfig};
use rokka_kafka::{Endpoint, Kafka, KafkaConfig};
use rokka_store::{MessageStore, StoreConfig};
use tokio::net::{TcpListener, TcpStream};

mod common;
use common::{call, closed};

type TestResult = Result<(), Box<dyn std::error::Error>>;

async fn start(
    dir: &std::path::Path,
) -> Result<(std::net::SocketAddr, tokio::sync::watch::Sender<bool>), Box<dyn std::error::Error>> {
    let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir))?);
    let broker = Arc::new(Broker::new(store, BrokerConfig::default())?);
    let m = Mechanism::Sha256;
    let salt = b"0123456789abcdef".to_vec();
    let salted = m.salted_password(b"pencil", &salt, 4096);
    broker
        .users()
        .upsert("user", m, 4096, salt, &salted)
        .map_err(|e| e.message)?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let config = KafkaConfig {
        sasl_failure_delay_ms: 1,
        ..KafkaConfig::default()
    };
    let kafka = Arc::new(Kafka::new(broker, config, rokka_group::GroupConfig::default(), addr));
    let (tx, rx) = tokio::sync::watch::channel(false);
    rokka_kafka::spawn_background(&kafka, &rx);
    let at = Endpoint {
        host: "127.0.0.1".into(),
        port: i32::from(addr.port()),
        ssl: false,
        sasl: true,
    };
    tokio::spawn(rokka_kafka::serve(listener, kafka, at, None, rx));
    Ok((addr, tx))
}

async fn handshake(s: &mut TcpStream, mechanism: &'static str) -> Result<i16, Box<dyn std::error::Error>> {
    let r: SaslHandshakeResponse = call(
        s,
        ApiKey::SaslHandshake,
        1,
        &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str(mechanism)),
    )
    .await?;
    Ok(r.error_code)
}

async fn auth(s: &mut TcpStream, bytes: Vec<u8>) -> Result<SaslAuthenticateResponse, Box<dyn std::error::Error>> {
    call(
        s,
        ApiKey::SaslAuthenticate,
        2,
        &SaslAuthenticateRequest::default().with_auth_bytes(bytes.into()),
    )
    .await
}

/// A SCRAM-SHA-256 exchange as a client: Ok(server's final message), or
/// the failing response's error code.
async fn scram(s: &mut TcpStream, password: &[u8]) -> Result<Result<String, i16>, Box<dyn std::error::Error>> {
    let m = Mechanism::Sha256;
    assert_eq!(handshake(s, "SCRAM-SHA-256").await?, 0);
    let bare = "n=user,r=clientnonce123";
    let first = auth(s, format!("n,,{bare}").into_bytes()).await?;
    if first.error_code != 0 {
        return Ok(Err(first.error_code));
    }
    let server_first = String::from_utf8(first.auth_bytes.to_vec())?;
    let mut nonce = "";
    let mut salt = Vec::new();
    let mut iterations = 0;
    for a in server_first.split(',') {
        if let Some(v) = a.strip_prefix("r=") {
            nonce = v;
        } else if let Some(v) = a.strip_prefix("s=") {
            salt = unb64(v).ok_or("salt")?;
        } else if let Some(v) = a.strip_prefix("i=") {
            iterations = v.parse()?;
        }
    }
    assert!(
        nonce.starts_with("clientnonce123") && nonce.len() > 14,
        "{server_first}"
    );
    let salted = m.salted_password(password, &salt, iterations);
    let client_key = m.hmac(&salted, b"Client Key");
    let stored = m.hash(&client_key);
    let without_proof = format!("c=biws,r={nonce}");
    let auth_message = format!("{bare},{server_first},{without_proof}");
    let signature = m.hmac(&stored, auth_message.as_bytes());
    let proof: Vec<u8> = client_key.iter().zip(&signature).map(|(a, b)| a ^ b).collect();
    let last = auth(s, format!("{without_proof},p={}", b64(&proof)).into_bytes()).await?;
    if last.error_code != 0 {
        return Ok(Err(last.error_code));
    }
    let server_key = m.hmac(&salted, b"Server Key");
    let expected = format!("v={}", b64(&m.hmac(&server_key, auth_message.as_bytes())));
    let got = String::from_utf8(last.auth_bytes.to_vec())?;
    assert_eq!(got, expected, "the server proves it holds the credential");
    Ok(Ok(got))
}

#[tokio::test]
async fn a_sasl_listener_serves_only_authenticated_connections() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (addr, _stop) = start(dir.path()).await?;
    // Metadata before authentication: the connection is closed.
    let mut s = TcpStream::connect(addr).await?;
    let r: Result<MetadataResponse, _> = call(&mut s, ApiKey::Metadata, 12, &MetadataRequest::default()).await;
    assert!(r.is_err(), "answered before authentication");
    // ApiVersions is answered before authentication; SCRAM then opens the
    // connection to everything.
    let mut s = TcpStream::connect(addr).await?;
    let v: ApiVersionsResponse = call(&mut s, ApiKey::ApiVersions, 3, &ApiVersionsRequest::default()).await?;
    assert_eq!(v.error_code, 0);
    assert!(scram(&mut s, b"pencil").await?.is_ok());
    let md: MetadataResponse = call(&mut s, ApiKey::Metadata, 12, &MetadataRequest::default()).await?;
    assert_eq!(md.brokers.len(), 1);
    // A second authentication on it is ILLEGAL_SASL_STATE (Kafka's request
    // handler answers it), and the connection stays served.
    let again = auth(&mut s, b"n,,n=user,r=x".to_vec()).await?;
    assert_eq!(again.error_code, 34);
    let md: MetadataResponse = call(&mut s, ApiKey::Metadata, 12, &MetadataRequest::default()).await?;
    assert_eq!(md.brokers.len(), 1);
    // A wrong password: SASL_AUTHENTICATION_FAILED, then closed.
    let mut s = TcpStream::connect(addr).await?;
    assert_eq!(scram(&mut s, b"wrong").await?, Err(58));
    assert!(closed(&mut s).await);
    // Unknown user, unknown mechanism, PLAIN with a wrong password.
    let mut s = TcpStream::connect(addr).await?;
    assert_eq!(handshake(&mut s, "SCRAM-SHA-256").await?, 0);
    assert_eq!(auth(&mut s, b"n,,n=nobody,r=abc".to_vec()).await?.error_code, 58);
    let mut s = TcpStream::connect(addr).await?;
    assert_eq!(handshake(&mut s, "GSSAPI").await?, 33);
    let mut s = TcpStream::connect(addr).await?;
    assert_eq!(handshake(&mut s, "PLAIN").await?, 0);
    assert_eq!(auth(&mut s, b"\0user\0nope".to_vec()).await?.error_code, 58);
    assert!(closed(&mut s).await);
    let mut s = TcpStream::connect(addr).await?;
    assert_eq!(handshake(&mut s, "PLAIN").await?, 0);
    assert_eq!(auth(&mut s, b"\0user\0pencil".to_vec()).await?.error_code, 0);
    let md: MetadataResponse = call(&mut s, ApiKey::Metadata, 12, &MetadataRequest::default()).await?;
    assert_eq!(md.brokers.len(), 1);
    Ok(())
}

/// SaslHandshake v0 (kafka-python up to 2.0.2): the mechanism's messages
/// follow as raw size-prefixed tokens — a PLAIN success is answered with an
/// empty token, then requests are served; a wrong password closes the
/// connection (the raw form has no place for an error).
#[tokio::test]
async fn a_v0_handshake_takes_raw_tokens() -> TestResult {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir()?;
    let (addr, _stop) = start(dir.path()).await?;
    async fn raw_plain(addr: std::net::SocketAddr, password: &[u8]) -> Result<TcpStream, Box<dyn std::error::Error>> {
        let mut s = TcpStream::connect(addr).await?;
        let r: SaslHandshakeResponse = call(
            &mut s,
            ApiKey::SaslHandshake,
            0,
            &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("PLAIN")),
        )
        .await?;
        assert_eq!(r.error_code, 0);
        let mut token = b"\0user\0".to_vec();
        token.extend_from_slice(password);
        let mut frame = (token.len() as i32).to_be_bytes().to_vec();
        frame.extend_from_slice(&token);
        s.write_all(&frame).await?;
        Ok(s)
    }
    let mut s = raw_plain(addr, b"pencil").await?;
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await?;
    assert_eq!(i32::from_be_bytes(len), 0, "an empty token: authenticated");
    let md: MetadataResponse = call(&mut s, ApiKey::Metadata, 12, &MetadataRequest::default()).await?;
    assert_eq!(md.brokers.len(), 1);
    let mut s = raw_plain(addr, b"nope").await?;
    assert!(closed(&mut s).await);
    Ok(())
}
