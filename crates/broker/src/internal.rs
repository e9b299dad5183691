//! Calls between the broker sets of a cluster (a Kafka group coordinator's
//! offset commits and reads on another set's master, transaction markers)
//! go over that master's RocketMQ listener. Under authorization they must
//! not be `User:ANONYMOUS`, whom a group's or topic's ACLs need not name:
//! the coordinator already authorized its client, so the call is signed as
//! the cluster's own — AccessKey `rokka-cluster:node-<id>`, an HMAC-SHA256
//! under a secret the nodes share through etcd (made once, by the first
//! node that starts) of the request's code, fields, body and signing time
//! (protocols/remoting's `auth`) — and a master takes a request so signed,
//! of the few codes those calls use, without checking ACLs. Anything else
//! with that AccessKey is refused.

use base64::Engine as _;
use ring::hmac;
use ring::rand::SecureRandom as _;

/// The AccessKey prefix of the cluster's own calls (not a user name any
/// client can authenticate as: requests with it are checked against the
/// cluster secret only).
pub const ACCESS_KEY_PREFIX: &str = "rokka-cluster:";

/// The secret the nodes of one cluster share.
pub struct ClusterSecret(hmac::Key);

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecret(..)")
    }
}

impl ClusterSecret {
    /// From its stored (base64) form; None when it is not one.
    pub fn from_stored(stored: &str) -> Option<ClusterSecret> {
        let raw = base64::engine::general_purpose::STANDARD.decode(stored.trim()).ok()?;
        (raw.len() >= 32).then(|| ClusterSecret(hmac::Key::new(hmac::HMAC_SHA256, &raw)))
    }

    /// A new random secret in its stored form (32 bytes, base64).
    pub fn generate() -> Result<String, String> {
        let mut raw = [0u8; 32];
        ring::rand::SystemRandom::new()
            .fill(&mut raw)
            .map_err(|_| "no randomness for the cluster secret".to_string())?;
        Ok(base64::engine::general_purpose::STANDARD.encode(raw))
    }

    /// The signature (base64) of `content` (what a cluster call signs:
    /// protocols/remoting's `cluster_content`).
    pub fn sign(&self, content: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(hmac::sign(&self.0, content).as_ref())
    }

    /// Whether `signature` is this secret's over `content` (compared in
    /// constant time).
    pub fn verify(&self, content: &[u8], signature: &str) -> bool {
        crate::users::unb64(signature).is_some_and(|given| hmac::verify(&self.0, content, &given).is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_under_its_secret_only() -> Result<(), String> {
        let stored = ClusterSecret::generate()?;
        let a = ClusterSecret::from_stored(&stored).ok_or("stored form")?;
        let b = ClusterSecret::from_stored(&ClusterSecret::generate()?).ok_or("stored form")?;
        let sig = a.sign(b"g1 7 body");
        assert!(a.verify(b"g1 7 body", &sig));
        assert!(!b.verify(b"g1 7 body", &sig), "another cluster's secret");
        assert!(!a.verify(b"g1 8 body", &sig), "other content");
        assert!(!a.verify(b"g1 7 body", "not base64!"));
        assert!(ClusterSecret::from_stored("c2hvcnQ=").is_none(), "too short a secret");
        Ok(())
    }
}
