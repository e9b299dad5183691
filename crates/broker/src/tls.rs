//! TLS server configs for the listeners of every frontend (rustls on the
//! ring provider): the certificate chain and key from PEM files; with a
//! client CA, clients must present a certificate it signed (mTLS). And the
//! client side nodes use among themselves (the replication stream).

use std::path::Path;
use std::sync::Arc;

use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// Builds the listener's acceptor; an error names the file and why, for
/// the operator (the node does not start).
pub fn acceptor(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<TlsAcceptor, String> {
    acceptor_for(cert, key, client_ca, &[])
}

/// As `acceptor`, offering the application protocols `alpn` (gRPC
/// clients require `h2` to be selected).
pub fn acceptor_for(cert: &Path, key: &Path, client_ca: Option<&Path>, alpn: &[&[u8]]) -> Result<TlsAcceptor, String> {
    let (chain, key) = identity(cert, key)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS versions: {e}"))?;
    let mut config = match client_ca {
        Some(ca) => {
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider)
                .build()
                .map_err(|e| format!("{}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    }
    .with_single_cert(chain, key)
    .map_err(|e| format!("{} / {}: {e}", cert.display(), "key"))?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// A client that trusts only servers whose certificate `ca` signed (and
/// that names the address it connects to), presenting `cert` itself — what
/// one node of a cluster uses to reach another.
pub fn connector(cert: &Path, key: &Path, ca: &Path) -> Result<TlsConnector, String> {
    let (chain, key) = identity(cert, key)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS versions: {e}"))?
        .with_root_certificates(roots(ca)?)
        .with_client_auth_cert(chain, key)
        .map_err(|e| format!("{} / {}: {e}", cert.display(), "key"))?;
    Ok(TlsConnector::from(Arc::new(config)))
}

/// A certificate chain (leaf first) and its key.
fn identity(cert: &Path, key: &Path) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("{}: {e}", cert.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!("{}: no certificate", cert.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("{}: {e}", key.display()))?;
    Ok((chain, key))
}

/// The CA certificates of a PEM file (at least one).
fn roots(ca: &Path) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).map_err(|e| format!("{}: {e}", ca.display()))? {
        let c = c.map_err(|e| format!("{}: {e}", ca.display()))?;
        roots.add(c).map_err(|e| format!("{}: {e}", ca.display()))?;
    }
    if roots.is_empty() {
        return Err(format!("{}: no CA certificate", ca.display()));
    }
    Ok(roots)
}

/// The principal a client certificate names: `User:` and the subject's
/// distinguished name in RFC 4514 form (`User:CN=alice,O=example`), as
/// Kafka's default SSL principal builder names it; None without a
/// certificate (or one whose subject cannot be read).
pub fn peer_principal(conn: &rustls::ServerConnection) -> Option<String> {
    use x509_cert::der::Decode as _;
    let leaf = conn.peer_certificates()?.first()?;
    let cert = x509_cert::Certificate::from_der(leaf.as_ref()).ok()?;
    Some(format!("User:{}", cert.tbs_certificate.subject))
}

/// The names a client certificate is for: its subjectAltName DNS names
/// (lower case) and IP addresses (as text); empty without a certificate or
/// with none readable.
pub fn peer_names(conn: &rustls::ServerConnection) -> Vec<String> {
    use x509_cert::der::Decode as _;
    use x509_cert::ext::pkix::name::GeneralName;
    use x509_cert::ext::pkix::SubjectAltName;
    let Some(leaf) = conn.peer_certificates().and_then(|c| c.first()) else {
        return Vec::new();
    };
    let Ok(cert) = x509_cert::Certificate::from_der(leaf.as_ref()) else {
        return Vec::new();
    };
    let Ok(Some((_, san))) = cert.tbs_certificate.get::<SubjectAltName>() else {
        return Vec::new();
    };
    san.0
        .iter()
        .filter_map(|n| match n {
            GeneralName::DnsName(d) => Some(d.as_str().to_ascii_lowercase()),
            GeneralName::IpAddress(ip) => match ip.as_bytes() {
                &[a, b, c, d] => Some(std::net::IpAddr::from([a, b, c, d]).to_string()),
                b if b.len() == 16 => {
                    let mut o = [0u8; 16];
                    o.copy_from_slice(b);
                    Some(std::net::IpAddr::from(o).to_string())
                }
                _ => None,
            },
            _ => None,
        })
        .collect()
}
