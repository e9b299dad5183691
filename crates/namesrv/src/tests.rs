//! The route table as (registrations, time, closed connections) → routes.

use std::net::SocketAddr;

use serde_json::json;

use super::*;

const DEFAULT_TIMEOUT: u64 = 120_000;

fn reg(name: &str, addr: &str, id: i64, topics: &[(&str, u32)]) -> Registration {
    Registration {
        cluster: "C".into(),
        broker_name: name.into(),
        broker_addr: addr.into(),
        broker_id: id,
        ha_addr: String::new(),
        timeout_ms: None,
        data_version: 1,
        topics: topics
            .iter()
            .map(|(t, n)| TopicConf {
                name: t.to_string(),
                read_queues: *n,
                write_queues: *n,
                perm: 6,
                sys_flag: 0,
            })
            .collect(),
        full: true,
    }
}

fn with_timeout(mut r: Registration, ms: u64) -> Registration {
    r.timeout_ms = Some(ms);
    r
}

fn peer(port: u16) -> SocketAddr {
    ([127, 0, 0, 1], port).into()
}

fn key(name: &str, addr: &str, id: i64) -> BrokerKey {
    BrokerKey {
        cluster: "C".into(),
        broker_name: name.into(),
        broker_id: id,
        broker_addr: addr.into(),
    }
}

#[test]
fn routes_follow_registrations_expiry_and_unregister() {
    let mut t = RouteTable::default();
    assert!(t.register(&reg("a", "h:1", 0, &[("T", 4)]), 0, DEFAULT_TIMEOUT, None));
    assert!(t.register(&reg("b", "h:2", 0, &[("T", 2), ("U", 1)]), 0, DEFAULT_TIMEOUT, None));
    let route = t.route("T").unwrap_or_default();
    assert_eq!(route["queueDatas"].as_array().map(Vec::len), Some(2));
    assert_eq!(route["brokerDatas"][0]["brokerAddrs"]["0"], "h:1");
    assert_eq!(t.topic_list(Some("C")), vec!["T".to_string(), "U".to_string()]);
    // Same registration again: nothing changed.
    assert!(!t.register(&reg("a", "h:1", 0, &[("T", 4)]), 10, DEFAULT_TIMEOUT, None));
    // b drops U from its registration.
    assert!(t.register(&reg("b", "h:2", 0, &[("T", 2)]), 10, DEFAULT_TIMEOUT, None));
    assert!(t.route("U").is_none());
    // b goes silent: after 120 s only a serves T.
    t.register(&reg("a", "h:1", 0, &[("T", 4)]), 100_000, DEFAULT_TIMEOUT, None);
    assert_eq!(t.expire(120_011), vec![key("b", "h:2", 0)]);
    let route = t.route("T").unwrap_or_default();
    assert_eq!(route["queueDatas"].as_array().map(Vec::len), Some(1));
    assert_eq!(t.cluster_info()["clusterAddrTable"]["C"], json!(["a"]));
    assert!(t.unregister(&key("a", "h:1", 0)));
    assert!(t.route("T").is_none());
    assert_eq!(t.broker_count(), 0);
    assert_eq!(t.cluster_info()["clusterAddrTable"], json!({}));
}

#[test]
fn a_custom_heartbeat_timeout_and_a_closed_channel_drop_the_broker() {
    let mut t = RouteTable::default();
    let r = with_timeout(reg("a", "h:1", 0, &[("T", 4)]), 1000);
    t.register(&r, 0, DEFAULT_TIMEOUT, Some(peer(5555)));
    assert!(t.expire(900).is_empty());
    assert_eq!(t.expire(1001), vec![key("a", "h:1", 0)]);
    t.register(&r, 2000, DEFAULT_TIMEOUT, Some(peer(5555)));
    assert_eq!(t.channel_closed(peer(5555)), vec![key("a", "h:1", 0)]);
    assert!(t.route("T").is_none());
}

// The three tests below use only calls whose shape did not change with the
// per-registration liveness (lengths, routes, counts), so they also ran
// against the table that kept liveness by address, where each one failed.

/// B registers on an address, C registers on the same one and keeps its
/// heartbeat; B goes silent and must expire by its own timeout.
#[test]
fn a_second_broker_name_on_an_address_does_not_make_the_first_immortal() {
    let mut t = RouteTable::default();
    let b = with_timeout(reg("B", "h:1", 0, &[("TB", 4)]), 1_000);
    let c = reg("C", "h:1", 0, &[("TC", 2)]);
    t.register(&b, 0, DEFAULT_TIMEOUT, Some(peer(1)));
    t.register(&c, 10, DEFAULT_TIMEOUT, Some(peer(2)));
    t.register(&c, 900, DEFAULT_TIMEOUT, Some(peer(2)));
    assert_eq!(t.expire(1_001).len(), 1, "B went silent and must expire");
    assert!(t.route("TB").is_none(), "the silent B is still routed");
    assert!(t.route("TC").is_some(), "C's route went with B's expiry");
    assert_eq!(t.broker_count(), 1, "C is live");
    // C in turn expires by its own clock, not B's.
    assert!(t.expire(900 + DEFAULT_TIMEOUT).is_empty());
    assert_eq!(t.expire(901 + DEFAULT_TIMEOUT).len(), 1);
    assert!(t.route("TC").is_none());
    assert_eq!(t.broker_count(), 0);
}

/// Each connection's close removes exactly the registration made over it,
/// whichever of the two registered last.
#[test]
fn closing_the_channel_that_registered_a_broker_removes_exactly_that_one() {
    for first_closed in [1u16, 2] {
        let mut t = RouteTable::default();
        t.register(&reg("B", "h:1", 0, &[("TB", 4)]), 0, DEFAULT_TIMEOUT, Some(peer(1)));
        t.register(&reg("C", "h:1", 0, &[("TC", 2)]), 10, DEFAULT_TIMEOUT, Some(peer(2)));
        let (gone, kept) = if first_closed == 1 { ("TB", "TC") } else { ("TC", "TB") };
        assert_eq!(t.channel_closed(peer(first_closed)).len(), 1, "closing {first_closed}");
        assert!(t.route(gone).is_none(), "{gone} outlived its connection");
        assert!(t.route(kept).is_some(), "{kept} went with another connection");
        assert_eq!(t.broker_count(), 1, "{kept} is still live");
        // The survivor still expires and still closes.
        let other = 3 - first_closed;
        assert_eq!(t.channel_closed(peer(other)).len(), 1);
        assert!(t.route(kept).is_none());
        assert_eq!(t.broker_count(), 0);
    }
}

/// A broker R heartbeats every 30 s; another name X registered on R's
/// address with a 1 s timeout expires alone: R keeps its route and its
/// liveness, and still expires by its own timeout once it stops.
#[test]
fn expiry_of_one_registration_never_drops_another_brokers_route() {
    let mut t = RouteTable::default();
    let r = reg("R", "h:1", 0, &[("TR", 8)]);
    t.register(&r, 0, DEFAULT_TIMEOUT, None);
    t.register(
        &with_timeout(reg("X", "h:1", 0, &[("TX", 1)]), 1_000),
        5_000,
        DEFAULT_TIMEOUT,
        Some(peer(9)),
    );
    assert_eq!(t.expire(6_001).len(), 1, "X expired");
    assert!(t.route("TX").is_none());
    assert!(t.route("TR").is_some(), "R's route dropped by X's expiry");
    assert_eq!(t.broker_count(), 1, "R's liveness dropped by X's expiry");
    t.register(&r, 30_000, DEFAULT_TIMEOUT, None);
    assert!(t.expire(30_000 + DEFAULT_TIMEOUT).is_empty());
    assert_eq!(t.expire(30_001 + DEFAULT_TIMEOUT).len(), 1, "R stopped and must expire");
    assert!(t.route("TR").is_none());
}

#[test]
fn expiry_and_close_report_the_full_key_of_what_they_removed() {
    let mut t = RouteTable::default();
    t.register(
        &with_timeout(reg("B", "h:1", 0, &[("T", 1)]), 1_000),
        0,
        DEFAULT_TIMEOUT,
        Some(peer(1)),
    );
    t.register(&reg("C", "h:1", 0, &[("T", 1)]), 0, DEFAULT_TIMEOUT, Some(peer(2)));
    assert_eq!(t.expire(1_001), vec![key("B", "h:1", 0)]);
    assert_eq!(t.channel_closed(peer(2)), vec![key("C", "h:1", 0)]);
    assert_eq!(key("B", "h:1", 0).to_string(), "C/B/0@h:1");
}

#[test]
fn unregister_needs_the_whole_key() {
    let mut t = RouteTable::default();
    t.register(&reg("B", "h:1", 0, &[("TB", 4)]), 0, DEFAULT_TIMEOUT, None);
    t.register(&reg("C", "h:1", 0, &[("TC", 4)]), 0, DEFAULT_TIMEOUT, None);
    for wrong in [
        key("B", "h:2", 0),
        key("B", "h:1", 1),
        key("D", "h:1", 0),
        BrokerKey {
            cluster: "other".into(),
            ..key("B", "h:1", 0)
        },
    ] {
        assert!(!t.unregister(&wrong), "{wrong} matched");
    }
    assert_eq!(t.broker_count(), 2);
    assert!(t.unregister(&key("C", "h:1", 0)));
    assert!(t.route("TC").is_none());
    assert!(t.route("TB").is_some(), "B shares C's address, not its registration");
    assert_eq!(t.broker_count(), 1);
}

/// A broker that moves to another address replaces its registration: the old
/// connection's close and the old heartbeat no longer touch it.
#[test]
fn a_moved_broker_replaces_its_old_registration() {
    let mut t = RouteTable::default();
    t.register(&reg("B", "h:1", 0, &[("T", 4)]), 0, DEFAULT_TIMEOUT, Some(peer(1)));
    assert!(t.register(&reg("B", "h:2", 0, &[("T", 4)]), 100, DEFAULT_TIMEOUT, Some(peer(2))));
    assert_eq!(t.broker_count(), 1);
    assert_eq!(
        t.route("T").unwrap_or_default()["brokerDatas"][0]["brokerAddrs"],
        json!({"0": "h:2"})
    );
    assert!(t.channel_closed(peer(1)).is_empty());
    assert!(!t.unregister(&key("B", "h:1", 0)));
    assert!(t.expire(DEFAULT_TIMEOUT + 1).is_empty(), "expired by the old heartbeat");
    assert_eq!(t.expire(DEFAULT_TIMEOUT + 101), vec![key("B", "h:2", 0)]);
}

/// Within one broker name an address holds one id (a slave promoted to
/// master leaves id 1); a master demoted to slave takes the routes with it.
#[test]
fn an_address_holds_one_id_within_a_broker_name() {
    let mut t = RouteTable::default();
    t.register(&reg("B", "h:1", 0, &[("T", 4)]), 0, DEFAULT_TIMEOUT, None);
    t.register(&reg("B", "h:2", 1, &[]), 0, DEFAULT_TIMEOUT, None);
    assert_eq!(t.broker_count(), 2);
    // h:2 is promoted (h:1 gone): it registers as master.
    assert!(t.unregister(&key("B", "h:1", 0)));
    assert!(t.route("T").is_none(), "no master, no writable route");
    assert!(t.register(&reg("B", "h:2", 0, &[("T", 4)]), 10, DEFAULT_TIMEOUT, None));
    assert_eq!(t.broker_count(), 1);
    assert_eq!(
        t.route("T").unwrap_or_default()["brokerDatas"][0]["brokerAddrs"],
        json!({"0": "h:2"})
    );
    // Demoted again: the master slot empties and the routes go.
    assert!(t.register(&reg("B", "h:2", 1, &[]), 20, DEFAULT_TIMEOUT, None));
    assert!(t.route("T").is_none());
    assert_eq!(
        t.cluster_info()["brokerAddrTable"]["B"]["brokerAddrs"],
        json!({"1": "h:2"})
    );
}

#[test]
fn a_broker_moving_cluster_leaves_the_old_one() {
    let mut t = RouteTable::default();
    t.register(&reg("B", "h:1", 0, &[("T", 4)]), 0, DEFAULT_TIMEOUT, None);
    let mut moved = reg("B", "h:1", 0, &[("T", 4)]);
    moved.cluster = "D".into();
    assert!(t.register(&moved, 10, DEFAULT_TIMEOUT, None));
    assert_eq!(t.cluster_info()["clusterAddrTable"], json!({"D": ["B"]}));
    assert!(t.topic_list(Some("C")).is_empty());
    assert!(!t.unregister(&key("B", "h:1", 0)), "the key names the old cluster");
    assert!(t.unregister(&moved.key()));
    assert_eq!(t.cluster_info()["clusterAddrTable"], json!({}));
}

#[test]
fn known_placements_fill_in_brokers_whose_registration_lags() {
    let mut t = RouteTable::default();
    t.register(&reg("set-a", "h:1", 0, &[("T", 2)]), 0, DEFAULT_TIMEOUT, None);
    t.register(&reg("set-b", "h:2", 0, &[]), 0, DEFAULT_TIMEOUT, None);
    // set-c has only a replica registered: its queues are not routed.
    t.register(&reg("set-c", "h:3", 4, &[]), 0, DEFAULT_TIMEOUT, None);
    let known = [
        ("set-a".to_string(), 9),
        ("set-b".to_string(), 3),
        ("set-c".to_string(), 1),
    ];
    let none = BTreeMap::new();
    let route = t.route_with("T", &known, &none).unwrap_or_default();
    let queues = route["queueDatas"].as_array().cloned().unwrap_or_default();
    let counts: Vec<(String, u64)> = queues
        .iter()
        .map(|q| {
            (
                q["brokerName"].as_str().unwrap_or("").to_string(),
                q["writeQueueNums"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    // A registration wins over the placement; set-b comes from the placement.
    assert_eq!(counts, vec![("set-a".to_string(), 2), ("set-b".to_string(), 3)]);
    assert_eq!(route["brokerDatas"].as_array().map(Vec::len), Some(2));
    // A topic no registration lists yet is routed from the placement alone.
    let fresh = t.route_with("New", &known, &none).unwrap_or_default();
    assert_eq!(fresh["queueDatas"].as_array().map(Vec::len), Some(2));
    assert!(t.route("New").is_none(), "without a placement only registrations route");
    assert!(t.route_with("New", &[("set-c".to_string(), 1)], &none).is_none());
    // The cluster's view names set-c's master (and set-d's, which has not
    // registered at all): their queues are routed to it.
    let masters: BTreeMap<String, (String, String)> = [
        ("set-c".to_string(), ("C".to_string(), "h:5".to_string())),
        ("set-d".to_string(), ("C".to_string(), "h:6".to_string())),
    ]
    .into();
    let known = [("set-c".to_string(), 1), ("set-d".to_string(), 2)];
    let r = t.route_with("New", &known, &masters).unwrap_or_default();
    assert_eq!(r["queueDatas"].as_array().map(Vec::len), Some(2));
    let addrs: Vec<&Value> = r["brokerDatas"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|b| &b["brokerAddrs"]["0"])
        .collect();
    assert_eq!(addrs, vec!["h:5", "h:6"]);
}

#[test]
fn a_wiped_brokers_queues_are_routed_read_only_until_write_is_added_back() {
    let mut t = RouteTable::default();
    t.register(&reg("a", "h:1", 0, &[("T", 4), ("U", 2)]), 0, DEFAULT_TIMEOUT, None);
    t.register(&reg("b", "h:2", 0, &[("T", 2)]), 0, DEFAULT_TIMEOUT, None);
    let perm_of = |t: &RouteTable, broker: &str| {
        let route = t.route("T").unwrap_or_default();
        route["queueDatas"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|q| q["brokerName"] == broker)
            .map(|q| q["perm"].clone())
    };
    assert_eq!(t.wipe_write_perm("a"), 2, "a's two writable topics");
    assert_eq!(t.wipe_write_perm("a"), 0, "wiped already");
    assert_eq!(perm_of(&t, "a"), Some(json!(4)));
    assert_eq!(perm_of(&t, "b"), Some(json!(6)));
    // The broker registering again (its heartbeat) does not undo it.
    t.register(&reg("a", "h:1", 0, &[("T", 4), ("U", 2)]), 10, DEFAULT_TIMEOUT, None);
    assert_eq!(perm_of(&t, "a"), Some(json!(4)));
    assert_eq!(t.add_write_perm("a"), 2);
    assert_eq!(perm_of(&t, "a"), Some(json!(6)));
    assert_eq!(t.add_write_perm("a"), 0);
    // Names the table does not hold are not kept.
    assert_eq!(t.wipe_write_perm("no-such-broker"), 0);
    assert!(t.write_wiped.is_empty());
}

#[test]
fn kv_configs_are_kept_per_namespace_within_a_budget() {
    let mut t = RouteTable::default();
    assert_eq!(t.put_kv("ORDER_TOPIC_CONFIG", "T", "a:4"), Ok(()));
    assert_eq!(t.get_kv("ORDER_TOPIC_CONFIG", "T"), Some("a:4"));
    assert_eq!(t.kv_list("ORDER_TOPIC_CONFIG").map(BTreeMap::len), Some(1));
    assert!(t.put_kv("n", "k", &"v".repeat(MAX_KV_BYTES + 1)).is_err());
    assert!(t.delete_kv("ORDER_TOPIC_CONFIG", "T"));
    assert!(!t.delete_kv("ORDER_TOPIC_CONFIG", "T"));
    assert!(t.kv_list("ORDER_TOPIC_CONFIG").is_none());
    // 1 MiB in all: 64 entries of 16 KiB values and their names fill it.
    let big = "v".repeat(MAX_KV_BYTES);
    let mut n = 0;
    while t.put_kv("n", &format!("{n:04}"), &big).is_ok() {
        n += 1;
    }
    assert_eq!(n, MAX_KV_TOTAL_BYTES / (MAX_KV_BYTES + 5));
    assert!(t.put_kv("n", "one more", &big).is_err());
    assert_eq!(t.put_kv("n", "0000", "small"), Ok(()), "a smaller value takes less");
    assert_eq!(t.put_kv("n", "one more", &big[..1000]), Ok(()));
    assert!(t.delete_kv("n", "0001"));
    assert_eq!(t.put_kv("n", "again", &big[..MAX_KV_BYTES - 10]), Ok(()));
}

/// Route entries are counted per (topic, broker name): what a name
/// server's budget holds registrations to; a broker's registration
/// replaces its own entries.
#[test]
fn route_entries_are_counted_per_topic_and_broker() {
    let mut t = RouteTable::default();
    t.register(
        &reg("a", "1.1.1.1:1", 0, &[("t1", 4), ("t2", 4)]),
        0,
        DEFAULT_TIMEOUT,
        None,
    );
    t.register(&reg("b", "1.1.1.2:1", 0, &[("t1", 4)]), 0, DEFAULT_TIMEOUT, None);
    // A replica of "a" shares its entries.
    t.register(
        &reg("a", "1.1.1.3:1", 1, &[("t1", 4), ("t2", 4)]),
        0,
        DEFAULT_TIMEOUT,
        None,
    );
    assert_eq!(t.route_entries(), 3);
    assert_eq!(t.route_entries_of("a"), 2);
    assert_eq!(t.route_entries_of("b"), 1);
    assert_eq!(t.route_entries_of("c"), 0);
}

/// An Apache broker's registration of a single new topic (not flagged as
/// its full table) adds that topic and removes none of its others.
#[test]
fn a_registration_not_of_the_full_table_removes_no_topic() {
    let mut t = RouteTable::default();
    t.register(
        &reg("a", "1.1.1.1:1", 0, &[("t1", 4), ("t2", 4)]),
        0,
        DEFAULT_TIMEOUT,
        None,
    );
    let mut one = reg("a", "1.1.1.1:1", 0, &[("t3", 4)]);
    one.full = false;
    t.register(&one, 1, DEFAULT_TIMEOUT, None);
    assert_eq!(t.route_entries_of("a"), 3);
    // A full one does.
    t.register(&reg("a", "1.1.1.1:1", 0, &[("t3", 4)]), 2, DEFAULT_TIMEOUT, None);
    assert_eq!(t.route_entries_of("a"), 1);
}

/// DELETE_TOPIC_IN_NAMESRV with a cluster name (5.x mqadmin deleteTopic
/// -c A) removes only that cluster's brokers' queues: another cluster
/// holding the topic keeps its route (it lost it until its next
/// registration). Without a name, the whole topic goes. The dashboard's
/// "system topics" are the cluster and broker names.
#[test]
fn deleting_a_topic_in_one_cluster_keeps_the_others_route() {
    let mut t = RouteTable::default();
    let mut b = reg("b", "h:2", 0, &[("T", 2)]);
    b.cluster = "D".into();
    t.register(&reg("a", "h:1", 0, &[("T", 4)]), 0, DEFAULT_TIMEOUT, None);
    t.register(&b, 0, DEFAULT_TIMEOUT, None);
    assert_eq!(t.system_topic_list(), vec!["C", "D", "a", "b"]);
    assert!(t.delete_topic_in("T", "C"));
    let route = t.route("T").unwrap_or_default();
    assert_eq!(route["queueDatas"].as_array().map(Vec::len), Some(1));
    assert_eq!(route["queueDatas"][0]["brokerName"], "b");
    assert!(!t.delete_topic_in("T", "nope"));
    assert!(t.delete_topic_in("T", ""));
    assert!(t.route("T").is_none());
}
