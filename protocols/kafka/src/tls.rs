//! TLS for the Kafka SSL listener (rustls, ring provider): the server
//! certificate chain and key from PEM files; with a client CA, clients must
//! present a certificate it signed (mTLS), and the connection's principal
//! is `User:` and the certificate's subject distinguished name in RFC 4514
//! form (`User:CN=alice,O=example`), as Kafka's default SSL principal
//! builder names it.

pub use rokka_broker::tls::{acceptor, peer_principal};
