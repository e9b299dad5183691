//! DescribeUserScramCredentials and AlterUserScramCredentials (KIP-554) on
//! the users table: salted credentials only, never a password.

use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use kafka_protocol::messages::describe_user_scram_credentials_response::{
    CredentialInfo, DescribeUserScramCredentialsResult,
};
use kafka_protocol::messages::*;
use rokka_broker::users::{code, Mechanism};

use kafka_protocol::protocol::StrBytes;

use super::str_bytes;

pub fn describe(k: &crate::Kafka, r: DescribeUserScramCredentialsRequest) -> DescribeUserScramCredentialsResponse {
    let names: Option<Vec<String>> = r
        .users
        .filter(|u| !u.is_empty())
        .map(|u| u.into_iter().map(|n| n.name.to_string()).collect());
    let results = k
        .broker
        .users()
        .describe(names.as_deref())
        .into_iter()
        .map(|(user, creds)| {
            let r = DescribeUserScramCredentialsResult::default().with_user(str_bytes(&user));
            match creds {
                Some(c) => r.with_credential_infos(
                    c.into_iter()
                        .map(|(m, i)| {
                            CredentialInfo::default()
                                .with_mechanism(m.kafka_id())
                                .with_iterations(i as i32)
                        })
                        .collect(),
                ),
                None => r
                    .with_error_code(code::RESOURCE_NOT_FOUND)
                    .with_error_message(Some(str_bytes(&format!("no credentials of {user}")))),
            }
        })
        .collect();
    DescribeUserScramCredentialsResponse::default().with_results(results)
}

/// CLUSTER_AUTHORIZATION_FAILED for every change asked.
pub fn refused(r: AlterUserScramCredentialsRequest) -> AlterUserScramCredentialsResponse {
    metrics::counter!("rokka_kafka_credential_changes_refused_total").increment(1);
    let names = r
        .deletions
        .iter()
        .map(|d| &d.name)
        .chain(r.upsertions.iter().map(|u| &u.name));
    let results = names
        .map(|n| {
            AlterUserScramCredentialsResult::default()
                .with_user(n.clone())
                .with_error_code(CLUSTER_AUTHORIZATION_FAILED)
                .with_error_message(Some(str_bytes("only kafka.super_users change credentials over SASL")))
        })
        .collect();
    AlterUserScramCredentialsResponse::default().with_results(results)
}

const CLUSTER_AUTHORIZATION_FAILED: i16 = 31;

pub fn alter(k: &crate::Kafka, r: AlterUserScramCredentialsRequest) -> AlterUserScramCredentialsResponse {
    let users = k.broker.users();
    let mut results = Vec::new();
    let bad_mechanism = |user: &StrBytes| {
        AlterUserScramCredentialsResult::default()
            .with_user(user.clone())
            .with_error_code(code::UNSUPPORTED_SASL_MECHANISM)
            .with_error_message(Some(str_bytes("unknown SCRAM mechanism")))
    };
    let answer = |user: &StrBytes, r: Result<(), rokka_broker::users::Refused>| {
        let out = AlterUserScramCredentialsResult::default().with_user(user.clone());
        match r {
            Ok(()) => out,
            Err(e) => out
                .with_error_code(e.code)
                .with_error_message(Some(str_bytes(&e.message))),
        }
    };
    for d in &r.deletions {
        results.push(match Mechanism::from_kafka_id(d.mechanism) {
            Some(m) => answer(&d.name, users.delete(d.name.as_str(), m)),
            None => bad_mechanism(&d.name),
        });
    }
    for u in r.upsertions {
        let res = match Mechanism::from_kafka_id(u.mechanism) {
            Some(m) => {
                let iterations = u32::try_from(u.iterations).unwrap_or(0);
                let done = users.upsert(u.name.as_str(), m, iterations, u.salt.to_vec(), &u.salted_password);
                if done.is_ok() {
                    tracing::info!(user = u.name.as_str(), mechanism = m.name(), "SCRAM credential set");
                }
                answer(&u.name, done)
            }
            None => bad_mechanism(&u.name),
        };
        results.push(res);
    }
    AlterUserScramCredentialsResponse::default().with_results(results)
}

/// An AlterUserScramCredentials answer, once every node can see what it
/// changed (cluster mode; Kafka answers after its metadata log commit):
/// REQUEST_TIMED_OUT for the changes if etcd does not hold them in time
/// (they stay queued and are written later).
pub async fn altered_in_cluster(
    k: &crate::Kafka,
    mut resp: AlterUserScramCredentialsResponse,
) -> AlterUserScramCredentialsResponse {
    let users = k.broker.users().changes();
    if resp.results.iter().any(|r| r.error_code == 0)
        && !users
            .replicated(users.last_change(), rokka_broker::watermark::CLUSTER_WAIT)
            .await
    {
        for r in resp.results.iter_mut().filter(|r| r.error_code == 0) {
            r.error_code = crate::errors::REQUEST_TIMED_OUT;
            r.error_message = Some(str_bytes(rokka_broker::watermark::NOT_IN_CLUSTER));
        }
    }
    resp
}
