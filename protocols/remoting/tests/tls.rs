//! TLS on the RocketMQ listeners, in-process with our own codec over a
//! rustls client (certificates made with the openssl command line):
//! `enforcing` serves TLS clients and closes plaintext ones; `permissive`
//! serves both on one port; a client that does not trust the certificate
//! gets no answer.

use std::process::Command;
use std::sync::Arc;

use bytes::BytesMut;
use rokka_broker::{Broker, BrokerConfig};
use rokka_remoting::codes::{request as rq, response as rs};
use rokka_remoting::*;
use rokka_store::{MessageStore, StoreConfig};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A CA and a server certificate for 127.0.0.1 signed by it, in `dir`.
fn pki(dir: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let run = |args: &[&str]| -> Result<(), Box<dyn std::error::Error>> {
        let out = Command::new("openssl").args(args).current_dir(dir).output()?;
        if !out.status.success() {
            return Err(format!("openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr)).into());
        }
        Ok(())
    };
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )?;
    run(&[
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=ca", "-keyout", "ca.key", "-out",
        "ca.pem",
    ])?;
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ])?;
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-out",
        "server.pem",
        "-extfile",
        "server.ext",
    ])?;
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=other",
        "-keyout",
        "other.key",
        "-out",
        "other.pem",
    ])?;
    Ok(())
}

/// A broker whose listener takes TLS in `mode`: its address and stop.
async fn serve_tls(
    dir: &std::path::Path,
    enforcing: bool,
) -> Result<(std::net::SocketAddr, tokio::sync::watch::Sender<bool>), Box<dyn std::error::Error>> {
    let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir.join("data")))?);
    let broker = Arc::new(Broker::new(store, BrokerConfig::default())?);
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?;
    let rmq = Arc::new(RocketMq::new(broker, RocketMqConfig::default(), addr));
    let acceptor = rokka_broker::tls::acceptor(&dir.join("server.pem"), &dir.join("server.key"), None)?;
    let tls = Tls {
        acceptor,
        enforcing,
        handshake_timeout: std::time::Duration::from_secs(5),
    };
    let (stop, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(serve_with(l, rmq, Some(tls), rx));
    Ok((addr, stop))
}

/// GET_ALL_TOPIC_CONFIG over `s`: the response code, or Err if the
/// connection closed first.
async fn ask<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S) -> Result<i32, Box<dyn std::error::Error>> {
    let mut cmd = RemotingCommand::request(rq::GET_ALL_TOPIC_CONFIG, 7);
    cmd.version = 453;
    let mut out = BytesMut::new();
    encode(&cmd, &mut out);
    s.write_all(&out).await?;
    s.flush().await?;
    let mut buf = BytesMut::new();
    loop {
        if let Some(r) = decode(&mut buf, DEFAULT_MAX_FRAME)? {
            return Ok(r.code);
        }
        let n = tokio::time::timeout(std::time::Duration::from_secs(5), s.read_buf(&mut buf)).await??;
        if n == 0 {
            return Err("closed".into());
        }
    }
}

async fn tls_client(
    addr: std::net::SocketAddr,
    ca: &std::path::Path,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, Box<dyn std::error::Error>> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca)? {
        roots.add(c?)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await?;
    Ok(connector.connect(ServerName::IpAddress(addr.ip().into()), tcp).await?)
}

#[tokio::test]
async fn enforcing_serves_tls_and_closes_plaintext_permissive_serves_both() -> TestResult {
    let dir = tempfile::tempdir()?;
    pki(dir.path())?;
    let ca = dir.path().join("ca.pem");

    let (enforcing, _stop) = serve_tls(dir.path(), true).await?;
    let mut s = tls_client(enforcing, &ca).await?;
    assert_eq!(ask(&mut s).await?, rs::SUCCESS);
    assert_eq!(
        ask(&mut s).await?,
        rs::SUCCESS,
        "a second request on the same TLS connection"
    );
    let mut plain = TcpStream::connect(enforcing).await?;
    assert!(
        ask(&mut plain).await.is_err(),
        "plaintext on an enforcing listener is closed"
    );
    // A client that does not trust the server's certificate fails its
    // handshake, and gets nothing.
    assert!(tls_client(enforcing, &dir.path().join("other.pem")).await.is_err());

    let perm_dir = dir.path().join("permissive");
    std::fs::create_dir_all(&perm_dir)?;
    for f in ["server.pem", "server.key"] {
        std::fs::copy(dir.path().join(f), perm_dir.join(f))?;
    }
    let (permissive, _stop2) = serve_tls(&perm_dir, false).await?;
    let mut s = tls_client(permissive, &ca).await?;
    assert_eq!(ask(&mut s).await?, rs::SUCCESS);
    let mut plain = TcpStream::connect(permissive).await?;
    assert_eq!(
        ask(&mut plain).await?,
        rs::SUCCESS,
        "plaintext beside TLS on a permissive listener"
    );
    Ok(())
}
