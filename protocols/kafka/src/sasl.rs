//! SASL on a Kafka listener (KIP-43, KIP-152): SaslHandshake v1 names the
//! mechanism, SaslAuthenticate carries its messages — PLAIN (RFC 4616) and
//! SCRAM-SHA-256/512 (RFC 5802, 7677) against the users table
//! (`rokka_broker::users`). Until a connection has authenticated, a SASL
//! listener answers only ApiVersions and these two; anything else closes
//! it, as Kafka does. A failed authentication is answered
//! SASL_AUTHENTICATION_FAILED after `sasl_failure_delay_ms` (Kafka
//! `connection.failed.authentication.delay.ms`) and the connection closes.

use kafka_protocol::messages::{SaslAuthenticateResponse, SaslHandshakeResponse};
use ring::rand::SecureRandom;
use rokka_broker::users::{b64, equal, unb64, Mechanism, ScramCredential};

use crate::api::str_bytes;
use crate::Kafka;

pub const UNSUPPORTED_SASL_MECHANISM: i16 = 33;
pub const ILLEGAL_SASL_STATE: i16 = 34;
pub const SASL_AUTHENTICATION_FAILED: i16 = 58;

/// Largest frame accepted before authentication (Kafka's
/// `sasl.server.max.receive.size`).
pub const MAX_RECEIVE_BYTES: usize = 512 * 1024;

/// The mechanisms Rokka implements.
pub const MECHANISMS: [&str; 3] = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mech {
    Plain,
    Scram(Mechanism),
}

impl Mech {
    fn label(self) -> &'static str {
        match self {
            Mech::Plain => "PLAIN",
            Mech::Scram(m) => m.name(),
        }
    }
}

#[derive(Debug)]
enum State {
    Start,
    Chosen(Mech),
    /// SCRAM, after the server-first message.
    ScramSent {
        m: Mechanism,
        user: String,
        gs2: String,
        client_first_bare: String,
        server_first: String,
        nonce: String,
        cred: ScramCredential,
    },
    Done,
    Failed,
}

/// One connection's SASL exchange.
#[derive(Debug)]
pub struct Sasl {
    required: bool,
    state: State,
    principal: Option<String>,
    /// SaslHandshake v0 chose the mechanism: its messages come as raw
    /// size-prefixed tokens, not in SaslAuthenticate (KIP-152's old form;
    /// kafka-python up to 2.0.2 speaks only it).
    raw: bool,
}

/// A refused authentication: the error and the message the client shows.
pub type Refusal = (i16, String);

impl Sasl {
    pub fn new(required: bool) -> Sasl {
        Sasl {
            required,
            state: State::Start,
            principal: None,
            raw: false,
        }
    }

    /// Whether the next frame is a raw SASL token (after a v0 handshake,
    /// until the exchange ends).
    pub fn raw_tokens(&self) -> bool {
        self.raw && matches!(self.state, State::Chosen(_) | State::ScramSent { .. })
    }

    /// Whether requests other than ApiVersions and SASL may be served.
    pub fn may_serve(&self) -> bool {
        !self.required || matches!(self.state, State::Done)
    }

    /// Whether the connection is to be closed after this answer.
    pub fn failed(&self) -> bool {
        matches!(self.state, State::Failed)
    }

    /// The authenticated user, if any.
    pub fn principal(&self) -> Option<&str> {
        self.principal.as_deref()
    }

    pub fn handshake(&mut self, k: &Kafka, mechanism: &str, version: i16) -> SaslHandshakeResponse {
        let enabled: Vec<&String> = k
            .config
            .sasl_mechanisms
            .iter()
            .filter(|m| MECHANISMS.contains(&m.as_str()))
            .collect();
        let listed = enabled.iter().map(|m| str_bytes(m)).collect();
        let resp = SaslHandshakeResponse::default().with_mechanisms(listed);
        // On a listener without SASL, and after authenticating, Kafka's
        // request handler answers a handshake ILLEGAL_SASL_STATE.
        if !self.required {
            return resp.with_error_code(ILLEGAL_SASL_STATE).with_mechanisms(Vec::new());
        }
        if !matches!(self.state, State::Start) {
            return resp.with_error_code(ILLEGAL_SASL_STATE);
        }
        let m = match mechanism {
            "PLAIN" => Mech::Plain,
            other => match Mechanism::from_name(other) {
                Some(m) => Mech::Scram(m),
                None => return resp.with_error_code(UNSUPPORTED_SASL_MECHANISM),
            },
        };
        if !enabled.iter().any(|e| e.as_str() == mechanism) {
            return resp.with_error_code(UNSUPPORTED_SASL_MECHANISM);
        }
        self.state = State::Chosen(m);
        self.raw = version == 0;
        resp
    }

    /// One SaslAuthenticate: the response, and whether it failed (the
    /// caller delays the answer and closes the connection after it).
    pub fn authenticate(&mut self, k: &Kafka, bytes: &[u8]) -> SaslAuthenticateResponse {
        // On a listener without SASL, or once authenticated: answered
        // ILLEGAL_SASL_STATE and the connection kept (Kafka's request
        // handler), not an authentication failure.
        if !self.required || matches!(self.state, State::Done) {
            return SaslAuthenticateResponse::default()
                .with_error_code(ILLEGAL_SASL_STATE)
                .with_error_message(Some(str_bytes(if self.required {
                    "SaslAuthenticate request received after successful authentication"
                } else {
                    "SaslAuthenticate on a listener without SASL"
                })));
        }
        let label = match &self.state {
            State::Chosen(m) => m.label(),
            State::ScramSent { m, .. } => m.name(),
            _ => "none",
        };
        let r = self.step(k, bytes);
        let result = match (&r, &self.state) {
            (Err(_), _) => "failed",
            (Ok(_), State::Done) => "ok",
            _ => "continue",
        };
        if result != "continue" {
            metrics::counter!("rokka_kafka_sasl_authentications_total", "mechanism" => label, "result" => result)
                .increment(1);
        }
        match r {
            Ok(out) => SaslAuthenticateResponse::default().with_auth_bytes(out.into()),
            Err((code, message)) => {
                self.state = State::Failed;
                SaslAuthenticateResponse::default()
                    .with_error_code(code)
                    .with_error_message(Some(str_bytes(&message)))
            }
        }
    }

    fn step(&mut self, k: &Kafka, bytes: &[u8]) -> Result<Vec<u8>, Refusal> {
        let failed = || {
            (
                SASL_AUTHENTICATION_FAILED,
                "Authentication failed: invalid credentials".to_string(),
            )
        };
        match std::mem::replace(&mut self.state, State::Failed) {
            State::Chosen(Mech::Plain) => {
                let mut parts = bytes.split(|b| *b == 0);
                let (Some(authz), Some(user), Some(pass), None) =
                    (parts.next(), parts.next(), parts.next(), parts.next())
                else {
                    return Err((SASL_AUTHENTICATION_FAILED, "malformed PLAIN message".into()));
                };
                let user = std::str::from_utf8(user).map_err(|_| failed())?;
                if !authz.is_empty() && authz != user.as_bytes() {
                    return Err((
                        SASL_AUTHENTICATION_FAILED,
                        "Authentication failed: the authorization id must be the user".into(),
                    ));
                }
                if !k.broker.users().check_password(user, pass) {
                    return Err(failed());
                }
                self.principal = Some(user.to_string());
                self.state = State::Done;
                Ok(Vec::new())
            }
            State::Chosen(Mech::Scram(m)) => {
                let msg = std::str::from_utf8(bytes).map_err(|_| failed())?;
                let first = ClientFirst::parse(msg).ok_or((
                    SASL_AUTHENTICATION_FAILED,
                    "malformed SCRAM client-first message".to_string(),
                ))?;
                let cred = k.broker.users().get(&first.user, m).ok_or_else(failed)?;
                let mut random = [0u8; 24];
                ring::rand::SystemRandom::new()
                    .fill(&mut random)
                    .map_err(|_| (SASL_AUTHENTICATION_FAILED, "no randomness".to_string()))?;
                let nonce = format!("{}{}", first.nonce, b64(&random));
                let server_first = format!("r={nonce},s={},i={}", b64(&cred.salt), cred.iterations);
                let out = server_first.clone().into_bytes();
                self.state = State::ScramSent {
                    m,
                    user: first.user,
                    gs2: first.gs2,
                    client_first_bare: first.bare,
                    server_first,
                    nonce,
                    cred,
                };
                Ok(out)
            }
            State::ScramSent {
                m,
                user,
                gs2,
                client_first_bare,
                server_first,
                nonce,
                cred,
            } => {
                let msg = std::str::from_utf8(bytes).map_err(|_| failed())?;
                let (without_proof, proof) = msg.rsplit_once(",p=").ok_or_else(failed)?;
                let proof = unb64(proof).ok_or_else(failed)?;
                let mut channel = None;
                let mut their_nonce = None;
                for attr in without_proof.split(',') {
                    if let Some(v) = attr.strip_prefix("c=") {
                        channel = Some(v);
                    } else if let Some(v) = attr.strip_prefix("r=") {
                        their_nonce = Some(v);
                    }
                }
                if channel != Some(b64(gs2.as_bytes()).as_str()) || their_nonce != Some(nonce.as_str()) {
                    return Err(failed());
                }
                let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
                let signature = m.hmac(&cred.stored_key, auth_message.as_bytes());
                if proof.len() != signature.len() {
                    return Err(failed());
                }
                let client_key: Vec<u8> = proof.iter().zip(&signature).map(|(a, b)| a ^ b).collect();
                if !equal(&m.hash(&client_key), &cred.stored_key) {
                    return Err(failed());
                }
                let server_signature = m.hmac(&cred.server_key, auth_message.as_bytes());
                self.principal = Some(user);
                self.state = State::Done;
                Ok(format!("v={}", b64(&server_signature)).into_bytes())
            }
            State::Start | State::Done | State::Failed => Err((
                ILLEGAL_SASL_STATE,
                "SaslAuthenticate out of order: SaslHandshake first, once".into(),
            )),
        }
    }
}

/// A SCRAM client-first message: `gs2-header client-first-bare`.
struct ClientFirst {
    gs2: String,
    bare: String,
    user: String,
    nonce: String,
}

impl ClientFirst {
    fn parse(msg: &str) -> Option<ClientFirst> {
        // gs2-header = ("n" | "y") "," [ "a=" authzid ] ","; channel
        // binding ("p=") is not offered.
        let (flag, rest) = msg.split_once(',')?;
        if flag != "n" && flag != "y" {
            return None;
        }
        let (authz, bare) = rest.split_once(',')?;
        if !authz.is_empty() && !authz.starts_with("a=") {
            return None;
        }
        let gs2 = format!("{flag},{authz},");
        let mut user = None;
        let mut nonce = None;
        for attr in bare.split(',') {
            if let Some(v) = attr.strip_prefix("n=") {
                user = Some(unescape(v)?);
            } else if let Some(v) = attr.strip_prefix("r=") {
                nonce = Some(v.to_string());
            } else if attr.starts_with("m=") || attr == "tokenauth=true" {
                // Mandatory extensions and delegation tokens: not served.
                return None;
            }
        }
        let (user, nonce) = (user?, nonce?);
        if user.is_empty() || nonce.is_empty() || !nonce.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
            return None;
        }
        if let Some(a) = authz.strip_prefix("a=") {
            if unescape(a)? != user {
                return None;
            }
        }
        Some(ClientFirst {
            gs2,
            bare: bare.to_string(),
            user,
            nonce,
        })
    }
}

/// A SCRAM saslname: `=2C` is ',' and `=3D` is '='; any other '=' is
/// malformed.
fn unescape(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('=') {
        out.push_str(&rest[..i]);
        match rest.get(i..i + 3) {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return None,
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_first_messages_parse_or_are_refused() {
        let f = ClientFirst::parse("n,,n=us=2Cer=3D,r=abc").map(|f| (f.gs2, f.bare, f.user, f.nonce));
        assert_eq!(
            f,
            Some(("n,,".into(), "n=us=2Cer=3D,r=abc".into(), "us,er=".into(), "abc".into()))
        );
        assert!(ClientFirst::parse("n,a=bob,n=bob,r=x").is_some());
        for bad in [
            "",
            "p=tls-unique,,n=a,r=b",
            "n,,n=a",
            "n,,r=b",
            "n,a=eve,n=bob,r=x",
            "n,,n=a=,r=b",
            "n,,n=a,r=b,tokenauth=true",
            "n,,n=a,r=b c",
        ] {
            assert!(ClientFirst::parse(bad).is_none(), "{bad}");
        }
    }
}
