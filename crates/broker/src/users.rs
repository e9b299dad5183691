//! Users and their credentials, one table for every protocol: SCRAM
//! credentials (RFC 5802, as Kafka stores them: salt, iterations, StoredKey,
//! ServerKey — never a password), managed with Kafka's
//! AlterUserScramCredentials and checked by SASL SCRAM and PLAIN. Kept in
//! `<data_dir>/config/users.json`, written whole and atomically on change.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use base64::Engine as _;
use ring::{digest, hmac, pbkdf2};
use serde::{Deserialize, Serialize};

use crate::error::Result;

/// A SCRAM mechanism.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mechanism {
    Sha256,
    Sha512,
}

/// [`Users::check_rocketmq_signature`]'s answer for a signature that does
/// not match the user's secret (the one failure that guesses a secret).
pub const WRONG_SIGNATURE: &str = "signature mismatch: wrong SecretKey";

impl Mechanism {
    pub const ALL: [Mechanism; 2] = [Mechanism::Sha256, Mechanism::Sha512];

    /// The SASL name (`SCRAM-SHA-256`).
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Sha256 => "SCRAM-SHA-256",
            Mechanism::Sha512 => "SCRAM-SHA-512",
        }
    }

    pub fn from_name(name: &str) -> Option<Mechanism> {
        Mechanism::ALL.into_iter().find(|m| m.name() == name)
    }

    /// Kafka's `ScramMechanism` id (1, 2).
    pub fn kafka_id(self) -> i8 {
        match self {
            Mechanism::Sha256 => 1,
            Mechanism::Sha512 => 2,
        }
    }

    pub fn from_kafka_id(id: i8) -> Option<Mechanism> {
        Mechanism::ALL.into_iter().find(|m| m.kafka_id() == id)
    }

    /// Kafka's bounds on iterations (`ScramMechanism` min, and its max).
    pub fn min_iterations(self) -> u32 {
        4096
    }

    pub const MAX_ITERATIONS: u32 = 16384;

    fn hmac_alg(self) -> hmac::Algorithm {
        match self {
            Mechanism::Sha256 => hmac::HMAC_SHA256,
            Mechanism::Sha512 => hmac::HMAC_SHA512,
        }
    }

    fn pbkdf2_alg(self) -> pbkdf2::Algorithm {
        match self {
            Mechanism::Sha256 => pbkdf2::PBKDF2_HMAC_SHA256,
            Mechanism::Sha512 => pbkdf2::PBKDF2_HMAC_SHA512,
        }
    }

    fn digest_alg(self) -> &'static digest::Algorithm {
        match self {
            Mechanism::Sha256 => &digest::SHA256,
            Mechanism::Sha512 => &digest::SHA512,
        }
    }

    /// The hash's output length.
    pub fn output_len(self) -> usize {
        self.digest_alg().output_len()
    }

    pub fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        hmac::sign(&hmac::Key::new(self.hmac_alg(), key), data)
            .as_ref()
            .to_vec()
    }

    pub fn hash(self, data: &[u8]) -> Vec<u8> {
        digest::digest(self.digest_alg(), data).as_ref().to_vec()
    }

    /// SaltedPassword = Hi(password, salt, iterations).
    pub fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        let mut out = vec![0u8; self.output_len()];
        let n = NonZeroU32::new(iterations.max(1)).unwrap_or(NonZeroU32::MIN);
        pbkdf2::derive(self.pbkdf2_alg(), n, salt, password, &mut out);
        out
    }
}

/// One user's credential for one mechanism.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScramCredential {
    #[serde(with = "b64")]
    pub salt: Vec<u8>,
    pub iterations: u32,
    #[serde(with = "b64")]
    pub stored_key: Vec<u8>,
    #[serde(with = "b64")]
    pub server_key: Vec<u8>,
}

impl ScramCredential {
    /// From a salted password (what AlterUserScramCredentials carries).
    pub fn from_salted(m: Mechanism, salt: Vec<u8>, iterations: u32, salted: &[u8]) -> ScramCredential {
        let client_key = m.hmac(salted, b"Client Key");
        ScramCredential {
            salt,
            iterations,
            stored_key: m.hash(&client_key),
            server_key: m.hmac(salted, b"Server Key"),
        }
    }

    /// Whether `password` is this credential's (SASL PLAIN).
    pub fn matches_password(&self, m: Mechanism, password: &[u8]) -> bool {
        let salted = m.salted_password(password, &self.salt, self.iterations);
        let client_key = m.hmac(&salted, b"Client Key");
        equal(&m.hash(&client_key), &self.stored_key)
    }
}

/// Whether a stored credential is one AlterUserScramCredentials could
/// have made (a hand-edited file or record is held to it: a huge
/// iteration count would make PLAIN a CPU sink).
fn acceptable(mechanism: &str, c: &ScramCredential) -> bool {
    Mechanism::from_name(mechanism).is_some_and(|m| {
        (m.min_iterations()..=Mechanism::MAX_ITERATIONS).contains(&c.iterations)
            && c.stored_key.len() == m.output_len()
            && c.server_key.len() == m.output_len()
    })
}

/// Compares in time independent of where they differ.
pub fn equal(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

mod b64 {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(s)
            .map_err(serde::de::Error::custom)
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct File {
    /// user → mechanism name → credential (and a RocketMQ secret)
    users: BTreeMap<String, UserRecord>,
}

/// A user's mechanisms and their iterations.
pub type Credentials = Vec<(Mechanism, u32)>;

/// Why a credential change was refused (Kafka's error code and message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub code: i16,
    pub message: String,
}

/// Kafka error codes of credential changes.
pub mod code {
    pub const RESOURCE_NOT_FOUND: i16 = 91;
    pub const UNSUPPORTED_SASL_MECHANISM: i16 = 33;
    pub const UNACCEPTABLE_CREDENTIAL: i16 = 93;
    pub const POLICY_VIOLATION: i16 = 44;
    /// Retriable: what the cluster mode's wait for etcd answers.
    pub const REQUEST_TIMED_OUT: i16 = 7;
}

#[derive(Debug)]
pub struct Users {
    path: PathBuf,
    table: std::sync::RwLock<File>,
    /// Writers take turns (see `change`).
    writing: Mutex<()>,
    max_users: usize,
    /// Cluster mode: users changed here and not yet written to the
    /// cluster's table (etcd); the cluster's older record is not applied
    /// over them meanwhile.
    changes: crate::watermark::KeyedChanges,
}

/// One user's credentials: SCRAM by mechanism name, and the secret RocketMQ
/// clients sign requests with (AccessKey = the user's name), kept as set
/// because an HMAC check needs it (as RocketMQ keeps it). The file's and
/// the cluster table's form.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserRecord {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rocketmq_secret: Option<String>,
    #[serde(flatten)]
    pub scram: BTreeMap<String, ScramCredential>,
}

impl UserRecord {
    pub fn is_empty(&self) -> bool {
        self.scram.is_empty() && self.rocketmq_secret.is_none()
    }
}

fn refused(code: i16, message: impl Into<String>) -> Refused {
    Refused {
        code,
        message: message.into(),
    }
}

impl Users {
    /// Loads `<data_dir>/config/users.json` (absent = no users).
    pub fn open(data_dir: &Path, max_users: usize) -> Result<Users> {
        let path = data_dir.join("config").join("users.json");
        let mut table: File = crate::json_file::read_or_default(&path)?;
        // A hand-edited file is held to what AlterUserScramCredentials
        // accepts (a huge iteration count would make PLAIN a CPU sink).
        for (user, creds) in table.users.iter_mut() {
            creds.scram.retain(|name, c| {
                let ok = acceptable(name, c);
                if !ok {
                    tracing::warn!(user, mechanism = name.as_str(), path = %path.display(), "ignoring a malformed credential");
                }
                ok
            });
        }
        table.users.retain(|_, c| !c.is_empty());
        metrics::gauge!("rokka_users").set(table.users.len() as f64);
        Ok(Users {
            path,
            table: std::sync::RwLock::new(table),
            writing: Mutex::new(()),
            max_users: max_users.max(1),
            changes: Default::default(),
        })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, File> {
        self.table.read().unwrap_or_else(|p| p.into_inner())
    }

    pub fn len(&self) -> usize {
        self.read().users.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, user: &str, m: Mechanism) -> Option<ScramCredential> {
        self.read().users.get(user).and_then(|c| c.scram.get(m.name())).cloned()
    }

    /// What `user`'s credentials are now, to tell a change (a new
    /// password, a mechanism deleted, the user gone): their stored keys by
    /// mechanism; None for no such user.
    pub fn fingerprint(&self, user: &str) -> Option<Vec<u8>> {
        let t = self.read();
        let c = t.users.get(user)?;
        let mut out = Vec::new();
        for (name, cred) in c.scram.iter() {
            out.extend_from_slice(name.as_bytes());
            out.push(0);
            out.extend_from_slice(&cred.stored_key);
        }
        Some(out)
    }

    /// Whether `password` is one of `user`'s credentials (SASL PLAIN).
    pub fn check_password(&self, user: &str, password: &[u8]) -> bool {
        let creds: Option<Vec<(Mechanism, ScramCredential)>> = {
            let t = self.read();
            t.users.get(user).map(|c| {
                c.scram
                    .iter()
                    .filter_map(|(n, c)| Some((Mechanism::from_name(n)?, c.clone())))
                    .collect()
            })
        };
        let Some(creds) = creds else {
            // An unknown user takes as long as a known one (a salted check,
            // out of the lock): how long a failure takes tells no one which
            // users exist.
            let m = Mechanism::Sha256;
            let _ = m.salted_password(password, b"rokka-no-such-user", m.min_iterations());
            return false;
        };
        creds.iter().any(|(m, c)| c.matches_password(*m, password))
    }

    /// Users and their mechanisms with iterations (all, or those named;
    /// a named user without credentials is `None`).
    pub fn describe(&self, names: Option<&[String]>) -> Vec<(String, Option<Credentials>)> {
        let t = self.read();
        let list = |c: &UserRecord| {
            c.scram
                .iter()
                .filter_map(|(n, c)| Some((Mechanism::from_name(n)?, c.iterations)))
                .collect::<Vec<_>>()
        };
        match names {
            None => t.users.iter().map(|(u, c)| (u.clone(), Some(list(c)))).collect(),
            Some(names) => names.iter().map(|u| (u.clone(), t.users.get(u).map(list))).collect(),
        }
    }

    /// What a user name may be: 1 to 256 bytes, no ':' (a name is the
    /// principal `User:<name>`; one with ':' would be taken as a principal
    /// itself — `User:admin` a super user, `CN=…` a certificate's) and no
    /// control characters.
    const USER_NAME_RULE: &str = "user names are 1 to 256 bytes, without ':' or control characters";

    fn valid_user_name(user: &str) -> bool {
        (1..=256).contains(&user.len()) && !user.contains(':') && !user.chars().any(char::is_control)
    }

    /// Sets `user`'s credential for `m` from a salted password.
    pub fn upsert(
        &self,
        user: &str,
        m: Mechanism,
        iterations: u32,
        salt: Vec<u8>,
        salted_password: &[u8],
    ) -> std::result::Result<(), Refused> {
        if !Self::valid_user_name(user) {
            return Err(refused(code::UNACCEPTABLE_CREDENTIAL, Self::USER_NAME_RULE));
        }
        if iterations < m.min_iterations() || iterations > Mechanism::MAX_ITERATIONS {
            return Err(refused(
                code::UNACCEPTABLE_CREDENTIAL,
                format!(
                    "iterations must be {} to {}",
                    m.min_iterations(),
                    Mechanism::MAX_ITERATIONS
                ),
            ));
        }
        if salted_password.len() != m.output_len() || salt.is_empty() || salt.len() > 1024 {
            return Err(refused(
                code::UNACCEPTABLE_CREDENTIAL,
                "salt or salted password malformed",
            ));
        }
        let cred = ScramCredential::from_salted(m, salt, iterations, salted_password);
        self.change(user, |users| {
            if !users.contains_key(user) && users.len() >= self.max_users {
                metrics::counter!("rokka_users_refused_total").increment(1);
                return Err(refused(
                    code::POLICY_VIOLATION,
                    format!("at most {} users (broker.max_users)", self.max_users),
                ));
            }
            let entry = users.entry(user.to_string()).or_default();
            // A password set through Kafka is not the RocketMQ secret any
            // more (only its salted form is known here) — and the other
            // mechanism derived from that secret goes with it: rotating
            // SCRAM-SHA-512 left SCRAM-SHA-256 (and PLAIN) taking the old
            // password.
            if entry.rocketmq_secret.take().is_some() {
                entry.scram.clear();
            }
            entry.scram.insert(m.name().to_string(), cred);
            Ok(())
        })
    }

    /// Deletes `user`'s credential for `m`.
    pub fn delete(&self, user: &str, m: Mechanism) -> std::result::Result<(), Refused> {
        self.change(user, |users| {
            let Some(c) = users.get_mut(user) else {
                return Err(refused(code::RESOURCE_NOT_FOUND, format!("no credential of {user}")));
            };
            if c.scram.remove(m.name()).is_none() {
                return Err(refused(
                    code::RESOURCE_NOT_FOUND,
                    format!("no {} credential of {user}", m.name()),
                ));
            }
            // A credential derived from a RocketMQ secret (mqadmin
            // createUser) deleted through Kafka revokes that password: the
            // secret and the other mechanism derived from it go too — left,
            // the user went on signing RocketMQ requests and logging in.
            if c.rocketmq_secret.take().is_some() {
                c.scram.clear();
            }
            if c.is_empty() {
                users.remove(user);
            }
            Ok(())
        })
    }

    /// Sets `user`'s password as RocketMQ's user admin does
    /// (AUTH_CREATE_USER: `must_exist` false, the user must be new;
    /// AUTH_UPDATE_USER: true): the RocketMQ secret, and SCRAM-SHA-256 and
    /// -512 credentials derived from it (random salt, the minimum
    /// iterations), so the same name and password serve Kafka SASL too.
    pub fn set_password(&self, user: &str, password: &str, must_exist: bool) -> std::result::Result<(), Refused> {
        use ring::rand::SecureRandom as _;
        if !Self::valid_user_name(user) {
            return Err(refused(code::UNACCEPTABLE_CREDENTIAL, Self::USER_NAME_RULE));
        }
        if password.is_empty() || password.len() > 1024 {
            return Err(refused(code::UNACCEPTABLE_CREDENTIAL, "passwords are 1 to 1024 bytes"));
        }
        let mut record = UserRecord {
            rocketmq_secret: Some(password.to_string()),
            scram: BTreeMap::new(),
        };
        let rng = ring::rand::SystemRandom::new();
        for m in Mechanism::ALL {
            let mut salt = vec![0u8; 16];
            rng.fill(&mut salt)
                .map_err(|_| refused(-1, "no randomness for a salt"))?;
            let iterations = m.min_iterations();
            let salted = m.salted_password(password.as_bytes(), &salt, iterations);
            let cred = ScramCredential::from_salted(m, salt, iterations, &salted);
            record.scram.insert(m.name().to_string(), cred);
        }
        self.change(user, |users| {
            match (users.contains_key(user), must_exist) {
                (true, false) => return Err(refused(code::POLICY_VIOLATION, format!("user {user} already exists"))),
                (false, true) => return Err(refused(code::RESOURCE_NOT_FOUND, format!("no user {user}"))),
                (false, false) if users.len() >= self.max_users => {
                    metrics::counter!("rokka_users_refused_total").increment(1);
                    return Err(refused(
                        code::POLICY_VIOLATION,
                        format!("at most {} users (broker.max_users)", self.max_users),
                    ));
                }
                _ => {}
            }
            users.insert(user.to_string(), record);
            Ok(())
        })
    }

    /// Deletes `user` and all its credentials.
    pub fn delete_user(&self, user: &str) -> std::result::Result<(), Refused> {
        self.change(user, |users| match users.remove(user) {
            Some(_) => Ok(()),
            None => Err(refused(code::RESOURCE_NOT_FOUND, format!("no user {user}"))),
        })
    }

    /// Applies `f` to a copy of the table, stores the copy, then makes it
    /// the table: writers take turns, and readers (every SASL
    /// authentication, every signed RocketMQ request) are locked out only
    /// for the swap, not the fsync. Nothing changes if `f` refuses or the
    /// write fails.
    fn change(
        &self,
        user: &str,
        f: impl FnOnce(&mut BTreeMap<String, UserRecord>) -> std::result::Result<(), Refused>,
    ) -> std::result::Result<(), Refused> {
        let _turn = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        // Cluster mode: at most broker.max_users changes wait for etcd.
        if !self.changes.has_room(&[user.to_string()], self.max_users) {
            metrics::counter!("rokka_users_refused_total").increment(1);
            return Err(refused(
                code::REQUEST_TIMED_OUT,
                format!(
                    "{} user changes made here wait for etcd (broker.max_users): try again once it holds them",
                    self.max_users
                ),
            ));
        }
        let mut next = self.read().clone();
        f(&mut next.users)?;
        self.persist(&next)
            .map_err(|e| refused(-1, format!("storing the change failed: {e}")))?;
        metrics::gauge!("rokka_users").set(next.users.len() as f64);
        *self.table.write().unwrap_or_else(|p| p.into_inner()) = next;
        self.changes.note(user);
        Ok(())
    }

    /// The secret RocketMQ clients of `user` sign with, if it has one.
    pub fn rocketmq_secret(&self, user: &str) -> Option<String> {
        self.read().users.get(user).and_then(|r| r.rocketmq_secret.clone())
    }

    /// Checks a RocketMQ request's `Signature` (base64 of an HMAC-SHA1, or
    /// HMAC-SHA256, of `content` under `user`'s secret, as RocketMQ's
    /// AclClientRPCHook signs). Err: why not, for the client's remark.
    pub fn check_rocketmq_signature<'a>(
        &self,
        user: &str,
        content: impl Iterator<Item = &'a [u8]> + Clone,
        signature: &str,
    ) -> std::result::Result<(), &'static str> {
        let Some(secret) = self.rocketmq_secret(user) else {
            return Err("unknown AccessKey, or a user without a RocketMQ secret");
        };
        let Some(given) = unb64(signature) else {
            return Err("malformed Signature");
        };
        for alg in [hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, hmac::HMAC_SHA256] {
            let key = hmac::Key::new(alg, secret.as_bytes());
            let mut ctx = hmac::Context::with_key(&key);
            for part in content.clone() {
                ctx.update(part);
            }
            if equal(ctx.sign().as_ref(), &given) {
                return Ok(());
            }
        }
        Err(WRONG_SIGNATURE)
    }

    /// Checks a RocketMQ 5 (gRPC) call's signature: `MQv2-HMAC-SHA1`, the
    /// hex of an HMAC-SHA1 of its `x-mq-date-time` header under `user`'s
    /// RocketMQ secret (either case). Err: why not, for the client.
    pub fn check_rocketmq5_signature(
        &self,
        user: &str,
        date_time: &str,
        signature_hex: &str,
    ) -> std::result::Result<(), &'static str> {
        let Some(secret) = self.rocketmq_secret(user) else {
            return Err("unknown AccessKey, or a user without a RocketMQ secret");
        };
        let Some(given) = unhex(signature_hex) else {
            return Err("malformed Signature");
        };
        let key = hmac::Key::new(hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, secret.as_bytes());
        if equal(hmac::sign(&key, date_time.as_bytes()).as_ref(), &given) {
            Ok(())
        } else {
            Err("signature mismatch: wrong SecretKey")
        }
    }

    /// Whether `user` is in the table.
    pub fn exists(&self, user: &str) -> bool {
        self.read().users.contains_key(user)
    }

    /// Every user's name, in order.
    pub fn names(&self) -> Vec<String> {
        self.read().users.keys().cloned().collect()
    }

    /// Cluster mode: the changes made here (users are one table for the
    /// whole cluster, in etcd).
    pub fn changes(&self) -> &crate::watermark::KeyedChanges {
        &self.changes
    }

    fn persist(&self, t: &File) -> Result<()> {
        // Credentials: readable by the broker's user only.
        crate::json_file::write(&self.path, t, true)
    }
}

impl crate::watermark::KeyedClusterTable for Users {
    type Record = UserRecord;
    const PREFIX: &'static str = "users/";
    const WHAT: &'static str = "user";

    fn changes(&self) -> &crate::watermark::KeyedChanges {
        &self.changes
    }

    fn record(&self, name: &str) -> Option<UserRecord> {
        self.read().users.get(name).cloned()
    }

    fn replace_from_cluster(&self, cluster: BTreeMap<String, UserRecord>) -> Result<()> {
        let _turn = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        let mine = self.read().users.clone();
        let mut cluster = crate::watermark::with_pending(cluster, &mine, &self.changes.pending());
        // Only what AlterUserScramCredentials would accept.
        for creds in cluster.values_mut() {
            creds.scram.retain(|name, c| acceptable(name, c));
        }
        cluster.retain(|_, c| !c.is_empty());
        if mine == cluster {
            return Ok(());
        }
        let next = File { users: cluster };
        self.persist(&next)?;
        metrics::gauge!("rokka_users").set(next.users.len() as f64);
        *self.table.write().unwrap_or_else(|p| p.into_inner()) = next;
        Ok(())
    }
}

/// A base64 of `b` (SCRAM messages carry binary fields so).
/// Hex (either case) to bytes; None if not hex.
fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    s.as_bytes()
        .chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

pub fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// The bytes of base64 `s`, if it is.
pub fn unb64(s: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD.decode(s).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::BrokerError;
    use crate::watermark::KeyedClusterTable;

    /// Cluster mode: a change is numbered; waiters see it once the
    /// controller says etcd holds it; a failed write is handed out again
    /// under a later number.
    #[test]
    fn changes_are_answered_once_the_cluster_holds_them() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| BrokerError::Io(PathBuf::new(), e))?;
        let users = Users::open(dir.path(), 10)?;
        let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_time().build() else {
            return Ok(());
        };
        let wait = std::time::Duration::from_millis(20);
        users.set_password("solo", "pw", false).expect("created");
        assert_eq!(users.changes().last_change(), 0, "a single node waits for nothing");
        assert!(rt.block_on(users.changes().replicated(users.changes().last_change(), wait)));
        users.changes().join_cluster();
        users.set_password("erin", "pw", false).expect("created");
        let seq = users.changes().last_change();
        assert_eq!(seq, 1);
        assert!(!rt.block_on(users.changes().replicated(seq, wait)), "not in etcd yet");
        let (taken, upto) = users.take_changes();
        assert_eq!((taken.len(), taken[0].0.as_str(), upto), (1, "erin", 1));
        users.changes().rechange(["erin".to_string()]);
        users.delete_user("solo").expect("deleted");
        let (taken, upto) = users.take_changes();
        let names: Vec<&str> = taken.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!((names, upto), (vec!["erin", "solo"], 2));
        assert!(taken[1].1.is_none(), "a deletion is written as one");
        users.changes().written_up_to(upto);
        assert!(rt.block_on(users.changes().replicated(seq, wait)));
        assert!(rt.block_on(users.changes().replicated(users.changes().last_change(), wait)));
        Ok(())
    }

    /// RFC 7677's SCRAM-SHA-256 example: user, password "pencil", the
    /// salt and iterations give the ServerKey and StoredKey it implies.
    #[test]
    fn user_names_that_would_read_as_principals_are_refused() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| BrokerError::Io(PathBuf::new(), e))?;
        let users = Users::open(dir.path(), 10)?;
        for bad in ["User:admin", "User:ANONYMOUS", "a:b", "", "tab\there"] {
            assert!(users.set_password(bad, "pw", false).is_err(), "{bad:?}");
        }
        let salt = vec![1u8; 16];
        let salted = Mechanism::Sha256.salted_password(b"pw", &salt, 4096);
        assert!(users
            .upsert("User:admin", Mechanism::Sha256, 4096, salt.clone(), &salted)
            .is_err());
        // Names a certificate subject or an e-mail address would use are fine.
        assert!(users.set_password("CN=alice,OU=ops", "pw", false).is_ok());
        assert!(users
            .upsert("bob@example.com", Mechanism::Sha256, 4096, salt, &salted)
            .is_ok());
        assert!(users.exists("CN=alice,OU=ops") && users.exists("bob@example.com"));
        assert!(!users.exists("User:admin"));
        Ok(())
    }

    #[test]
    fn a_rocketmq_password_is_its_secret_and_the_users_scram_credentials() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| BrokerError::Io(PathBuf::new(), e))?;
        let users = Users::open(dir.path(), 10)?;
        users.set_password("carol", "carol-secret", false).expect("created");
        assert_eq!(
            users.set_password("carol", "x", false).map_err(|e| e.code),
            Err(code::POLICY_VIOLATION)
        );
        assert_eq!(
            users.set_password("dave", "x", true).map_err(|e| e.code),
            Err(code::RESOURCE_NOT_FOUND)
        );
        assert!(
            users.check_password("carol", b"carol-secret"),
            "PLAIN/SCRAM from the same password"
        );
        // RocketMQ 5's MQv2-HMAC-SHA1: hex of HMAC-SHA1(secret, date-time)
        // (RFC 2202 style vector: key "key").
        users.set_password("fox", "key", false).expect("created");
        let fox = "The quick brown fox jumps over the lazy dog";
        let sig = "de7c9b85b8b78aa6bc8a7a36f70a90701c9db4d9";
        assert_eq!(users.check_rocketmq5_signature("fox", fox, sig), Ok(()));
        assert_eq!(users.check_rocketmq5_signature("fox", fox, &sig.to_uppercase()), Ok(()));
        assert!(users.check_rocketmq5_signature("fox", "20261203T000000Z", sig).is_err());
        assert!(users.check_rocketmq5_signature("fox", fox, "zz").is_err());
        assert!(users.check_rocketmq5_signature("nobody", fox, sig).is_err());
        users.delete_user("fox").expect("deleted");
        let reopened = Users::open(dir.path(), 10)?;
        assert_eq!(reopened.rocketmq_secret("carol").as_deref(), Some("carol-secret"));
        assert!(reopened.get("carol", Mechanism::Sha512).is_some());
        // A password set through Kafka (salted only) ends the RocketMQ one.
        let m = Mechanism::Sha256;
        let salted = m.salted_password(b"new", b"salt", 4096);
        reopened
            .upsert("carol", m, 4096, b"salt".to_vec(), &salted)
            .expect("upsert");
        assert_eq!(reopened.rocketmq_secret("carol"), None);
        // ... and the other mechanism derived from the old password.
        assert!(reopened.get("carol", Mechanism::Sha512).is_none());
        assert!(
            !reopened.check_password("carol", b"carol-secret"),
            "the old password is gone"
        );
        assert!(reopened.check_password("carol", b"new"));
        // A credential of a RocketMQ-made user deleted through Kafka
        // revokes the password: secret and both mechanisms.
        reopened.set_password("erin", "erin-secret", false).expect("created");
        reopened.delete("erin", Mechanism::Sha256).expect("deleted");
        assert!(!reopened.exists("erin"));
        assert_eq!(reopened.rocketmq_secret("erin"), None);
        assert!(!reopened.check_password("erin", b"erin-secret"));
        // A change that cannot be stored (a directory where its temporary
        // file goes) is refused and changes nothing.
        let blocker = dir.path().join("config").join("users.tmp");
        std::fs::create_dir_all(&blocker).map_err(|e| BrokerError::Io(blocker.clone(), e))?;
        assert_eq!(reopened.delete_user("carol").map_err(|e| e.code), Err(-1));
        assert!(reopened.exists("carol"));
        assert!(reopened.set_password("dave", "dave-pw", false).is_err());
        assert!(!reopened.exists("dave"));
        std::fs::remove_dir(&blocker).map_err(|e| BrokerError::Io(blocker.clone(), e))?;
        reopened.delete_user("carol").expect("deleted");
        assert!(reopened.is_empty());
        Ok(())
    }

    #[test]
    fn credentials_follow_the_rfc_and_survive_a_restart() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| BrokerError::Io(PathBuf::new(), e))?;
        let m = Mechanism::Sha256;
        let salt = unb64("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap_or_default();
        let salted = m.salted_password(b"pencil", &salt, 4096);
        let users = Users::open(dir.path(), 10)?;
        assert_eq!(users.upsert("user", m, 4096, salt.clone(), &salted), Ok(()));
        let c = users.get("user", m).ok_or(BrokerError::UnknownTopic("user".into()))?;
        // ServerSignature of RFC 7677's exchange, from the stored ServerKey.
        let auth = "n=user,r=rOprNGfwEbeRWgbNEkqO,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096,c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
        assert_eq!(
            b64(&m.hmac(&c.server_key, auth.as_bytes())),
            "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
        );
        assert!(users.check_password("user", b"pencil"));
        assert!(!users.check_password("user", b"pencil2"));
        assert!(!users.check_password("nobody", b"pencil"));
        let short = users.upsert("user", m, 100, salt.clone(), &salted);
        assert_eq!(short.map_err(|r| r.code), Err(code::UNACCEPTABLE_CREDENTIAL));
        drop(users);
        let users = Users::open(dir.path(), 1)?;
        assert!(users.check_password("user", b"pencil"), "kept on disk");
        let full = users.upsert("other", m, 4096, salt, &salted);
        assert_eq!(full.map_err(|r| r.code), Err(code::POLICY_VIOLATION));
        assert_eq!(users.describe(None), vec![("user".to_string(), Some(vec![(m, 4096)]))]);
        assert_eq!(
            users.delete("user", Mechanism::Sha512).map_err(|r| r.code),
            Err(code::RESOURCE_NOT_FOUND)
        );
        assert_eq!(users.delete("user", m), Ok(()));
        assert!(users.is_empty());
        Ok(())
    }
}
