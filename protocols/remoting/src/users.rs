//! RocketMQ 5's user admin codes (mqadmin createUser / updateUser /
//! deleteUser / getUser / listUser) on the broker's one users table: a
//! user's password is its RocketMQ secret (the SecretKey its clients sign
//! with, AccessKey = its name) and its Kafka SCRAM credentials, so one
//! name and password serve both protocols. Passwords are never answered.

use bytes::Bytes;
use rokka_broker::Broker;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::codes::{request as rq, response as rs};
use crate::command::RemotingCommand;

/// RocketMQ's `UserInfo` body.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct UserInfo {
    username: Option<String>,
    password: Option<String>,
    user_type: Option<String>,
    user_status: Option<String>,
}

use rokka_broker::watermark::{CLUSTER_WAIT, NOT_IN_CLUSTER};

fn described(name: &str) -> Value {
    json!({"username": name, "userType": "Normal", "userStatus": "enable"})
}

/// Answers one of AUTH_CREATE_USER … AUTH_LIST_USERS: (code, remark, body);
/// in cluster mode a change once etcd holds it.
pub async fn handle(broker: &Broker, cmd: &RemotingCommand) -> (i32, Option<String>, Bytes) {
    let answer = answer(broker, cmd);
    let users = broker.users();
    let changes = matches!(
        cmd.code,
        rq::AUTH_CREATE_USER | rq::AUTH_UPDATE_USER | rq::AUTH_DELETE_USER
    );
    if changes
        && answer.0 == rs::SUCCESS
        && !users
            .changes()
            .replicated(users.changes().last_change(), CLUSTER_WAIT)
            .await
    {
        return (rs::SYSTEM_ERROR, Some(NOT_IN_CLUSTER.into()), Bytes::new());
    }
    answer
}

fn answer(broker: &Broker, cmd: &RemotingCommand) -> (i32, Option<String>, Bytes) {
    let users = broker.users();
    let info: UserInfo = if cmd.body.is_empty() {
        UserInfo::default()
    } else {
        match serde_json::from_slice(&cmd.body) {
            Ok(i) => i,
            Err(e) => {
                return (
                    rs::SYSTEM_ERROR,
                    Some(format!("malformed UserInfo body: {e}")),
                    Bytes::new(),
                )
            }
        }
    };
    let name = cmd
        .ext_fields
        .get("username")
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .or(info.username.clone())
        .unwrap_or_default();
    let done = |r: Result<(), rokka_broker::users::Refused>, what: &str| match r {
        Ok(()) => {
            tracing::info!(user = name.as_str(), "RocketMQ user {what}");
            (rs::SUCCESS, None, Bytes::new())
        }
        Err(e) => (rs::SYSTEM_ERROR, Some(e.message), Bytes::new()),
    };
    match cmd.code {
        rq::AUTH_CREATE_USER | rq::AUTH_UPDATE_USER => {
            let update = cmd.code == rq::AUTH_UPDATE_USER;
            // What Rokka does not keep is refused, not answered SUCCESS and
            // dropped: an admin disabling a compromised user (`mqadmin
            // updateUser -s disable`) would be told it worked while the
            // user goes on signing. Super users come from the config.
            if let Some(s) = info
                .user_status
                .as_deref()
                .filter(|s| !s.eq_ignore_ascii_case("enable"))
            {
                return (
                    rs::SYSTEM_ERROR,
                    Some(format!(
                        "user status {s:?} is not supported: delete the user (deleteUser) or change its password"
                    )),
                    Bytes::new(),
                );
            }
            if let Some(t) = info.user_type.as_deref().filter(|t| !t.eq_ignore_ascii_case("normal")) {
                return (
                    rs::SYSTEM_ERROR,
                    Some(format!(
                        "user type {t:?} is not supported: super users are named by security.super_users"
                    )),
                    Bytes::new(),
                );
            }
            match info.password.as_deref().filter(|p| !p.is_empty()) {
                Some(p) => {
                    let r = rokka_broker::offload(|| users.set_password(&name, p, update));
                    done(r, if update { "updated" } else { "created" })
                }
                // An update naming the status or type it has already.
                None if update && users.exists(&name) => (rs::SUCCESS, None, Bytes::new()),
                None => (rs::SYSTEM_ERROR, Some("a password is required".into()), Bytes::new()),
            }
        }
        rq::AUTH_DELETE_USER => done(rokka_broker::offload(|| users.delete_user(&name)), "deleted"),
        rq::AUTH_GET_USER => match users.exists(&name) {
            true => (rs::SUCCESS, None, Bytes::from(described(&name).to_string())),
            false => (rs::SYSTEM_ERROR, Some(format!("no user {name}")), Bytes::new()),
        },
        _ => {
            let filter = cmd.ext_fields.get("filter").unwrap_or_default();
            let list: Vec<Value> = users
                .names()
                .iter()
                .filter(|n| n.contains(filter))
                .map(|n| described(n))
                .collect();
            (rs::SUCCESS, None, Bytes::from(Value::Array(list).to_string()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn request(code: i32, body: Value) -> RemotingCommand {
        let mut c = RemotingCommand::request(code, 0);
        c.body = Bytes::from(body.to_string());
        c
    }

    /// `mqadmin updateUser -s disable` (and a Super user type) is refused,
    /// the user and its password left as they were — not answered
    /// SUCCESS with the disable dropped.
    #[test]
    fn a_status_or_type_rokka_does_not_keep_is_refused() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = Arc::new(rokka_store::MessageStore::open(rokka_store::StoreConfig::for_tests(
            dir.path(),
        ))?);
        let broker = Broker::new(store, rokka_broker::BrokerConfig::default())?;
        let create = request(
            rq::AUTH_CREATE_USER,
            json!({"username": "mallory", "password": "pw-1", "userType": "Normal"}),
        );
        assert_eq!(answer(&broker, &create).0, rs::SUCCESS);
        for body in [
            json!({"username": "mallory", "userStatus": "disable"}),
            json!({"username": "mallory", "password": "pw-2", "userStatus": "DISABLE"}),
            json!({"username": "mallory", "password": "pw-2", "userType": "Super"}),
        ] {
            let (code, remark, _) = answer(&broker, &request(rq::AUTH_UPDATE_USER, body.clone()));
            assert_eq!(code, rs::SYSTEM_ERROR, "{body}");
            assert!(remark.is_some_and(|r| r.contains("not supported")));
        }
        assert!(
            broker.users().check_password("mallory", b"pw-1"),
            "the password was left as it was"
        );
        let enable = request(
            rq::AUTH_UPDATE_USER,
            json!({"username": "mallory", "userStatus": "enable"}),
        );
        assert_eq!(answer(&broker, &enable).0, rs::SUCCESS);
        Ok(())
    }
}
