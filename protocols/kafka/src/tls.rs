//! TLS for the Kafka SSL listener (rustls, ring provider): the server
//! certificate chain and key from PEM files; with a client CA, clients must
//! present a certificate it signed (mTLS), and the connection's principal
//! is `User:` and the certificate's subject distinguished name in RFC 4514
//! form (`User:CN=alice,O=example`), as Kafka's default SSL principal
//! builder names it.

pub use rokka_broker::tls::acceptor;

use tokio_rustls::rustls;

/// The principal a client certificate names: `User:<subject DN>`; None
/// without a certificate (or one whose subject cannot be read).
pub fn peer_principal(conn: &rustls::ServerConnection) -> Option<String> {
    use x509_cert::der::Decode as _;
    let leaf = conn.peer_certificates()?.first()?;
    let cert = x509_cert::Certificate::from_der(leaf.as_ref()).ok()?;
    Some(format!("User:{}", cert.tbs_certificate.subject))
}
