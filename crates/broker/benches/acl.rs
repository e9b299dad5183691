//! The ACL check's cost: `cargo bench -p rokka-broker --bench acl`.
//! `Acls::authorize` (what every Kafka request runs once per topic, group
//! or resource it names, and every checked RocketMQ request once or twice)
//! with authorization off, and on with tables of 10, 1,000 and 10,000 ACLs
//! of other principals and topics plus the ones deciding the case: an
//! allow by literal name, by prefix, by the `*` wildcard, and a refusal.
//! Prints ns per check.

use std::hint::black_box;
use std::net::IpAddr;
use std::time::Instant;

use rokka_broker::acl::{Acl, AclSettings, Acls, Operation, PatternType, Permission, ResourceType};

fn acl(name: &str, pattern: PatternType, principal: &str, op: Operation) -> Acl {
    Acl {
        resource_type: ResourceType::Topic,
        name: name.into(),
        pattern,
        principal: principal.into(),
        host: "*".into(),
        operation: op,
        permission: Permission::Allow,
    }
}

fn per_check(acls: &Acls, principal: &str, topic: &str, op: Operation, host: IpAddr) -> f64 {
    let n = 200_000;
    let t = Instant::now();
    let mut ok = 0u32;
    for _ in 0..n {
        ok += u32::from(acls.authorize(black_box(principal), host, ResourceType::Topic, black_box(topic), op));
    }
    black_box(ok);
    t.elapsed().as_nanos() as f64 / n as f64
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let host: IpAddr = "127.0.0.1".parse()?;
    let off_dir = tempfile::tempdir()?;
    let off = Acls::open(off_dir.path())?;
    println!(
        "authorization off: {:.1} ns/check",
        per_check(&off, "User:alice", "orders", Operation::Write, host)
    );
    for others in [10usize, 1_000, 10_000] {
        let dir = tempfile::tempdir()?;
        let acls = Acls::open(dir.path())?;
        acls.configure(AclSettings {
            enabled: true,
            max_acls: others + 10,
            ..AclSettings::default()
        });
        let mut table: Vec<Acl> = (0..others)
            .map(|i| {
                let pattern = if i % 2 == 0 {
                    PatternType::Literal
                } else {
                    PatternType::Prefixed
                };
                acl(&format!("other-{i}"), pattern, &format!("User:u{i}"), Operation::Read)
            })
            .collect();
        table.push(acl("orders", PatternType::Literal, "User:alice", Operation::Write));
        table.push(acl("pay-", PatternType::Prefixed, "User:alice", Operation::Write));
        table.push(acl("*", PatternType::Literal, "User:bob", Operation::All));
        let made = acls.create(table);
        if let Some(e) = made.iter().find_map(|r| r.as_ref().err()) {
            return Err(e.message.clone().into());
        }
        println!(
            "{others:>6} other ACLs: literal allow {:.0} ns, prefix allow {:.0} ns, wildcard allow {:.0} ns, refusal {:.0} ns per check",
            per_check(&acls, "User:alice", "orders", Operation::Write, host),
            per_check(&acls, "User:alice", "pay-eu", Operation::Write, host),
            per_check(&acls, "User:bob", "anything", Operation::Write, host),
            per_check(&acls, "User:carol", "orders", Operation::Write, host),
        );
    }
    Ok(())
}
