//! Request and response codes (`RequestCode.java`, `ResponseCode.java`;
//! digest §2.1 and §3). Only the ones Rokka names in code are listed.

pub mod request {
    pub const SEND_MESSAGE: i32 = 10;
    pub const PULL_MESSAGE: i32 = 11;
    pub const QUERY_MESSAGE: i32 = 12;
    pub const QUERY_CONSUMER_OFFSET: i32 = 14;
    pub const UPDATE_CONSUMER_OFFSET: i32 = 15;
    pub const UPDATE_AND_CREATE_TOPIC: i32 = 17;
    pub const GET_ALL_TOPIC_CONFIG: i32 = 21;
    /// mqadmin getBrokerConfig, the dashboard's broker config view.
    pub const GET_BROKER_CONFIG: i32 = 26;
    pub const GET_BROKER_RUNTIME_INFO: i32 = 28;
    pub const SEARCH_OFFSET_BY_TIMESTAMP: i32 = 29;
    pub const GET_MAX_OFFSET: i32 = 30;
    pub const GET_MIN_OFFSET: i32 = 31;
    pub const GET_EARLIEST_MSG_STORETIME: i32 = 32;
    pub const VIEW_MESSAGE_BY_ID: i32 = 33;
    pub const HEART_BEAT: i32 = 34;
    pub const UNREGISTER_CLIENT: i32 = 35;
    pub const CONSUMER_SEND_MSG_BACK: i32 = 36;
    pub const END_TRANSACTION: i32 = 37;
    pub const GET_CONSUMER_LIST_BY_GROUP: i32 = 38;
    pub const CHECK_TRANSACTION_STATE: i32 = 39;
    pub const NOTIFY_CONSUMER_IDS_CHANGED: i32 = 40;
    pub const LOCK_BATCH_MQ: i32 = 41;
    pub const UNLOCK_BATCH_MQ: i32 = 42;
    pub const REGISTER_BROKER: i32 = 103;
    pub const UNREGISTER_BROKER: i32 = 104;
    pub const GET_ROUTEINFO_BY_TOPIC: i32 = 105;
    pub const GET_BROKER_CLUSTER_INFO: i32 = 106;
    pub const PUT_KV_CONFIG: i32 = 100;
    pub const GET_KV_CONFIG: i32 = 101;
    pub const DELETE_KV_CONFIG: i32 = 102;
    pub const GET_TOPIC_STATS_INFO: i32 = 202;
    pub const GET_CONSUMER_CONNECTION_LIST: i32 = 203;
    pub const GET_PRODUCER_CONNECTION_LIST: i32 = 204;
    pub const WIPE_WRITE_PERM_OF_BROKER: i32 = 205;
    pub const GET_ALL_TOPIC_LIST_FROM_NAMESERVER: i32 = 206;
    /// mqadmin updateSubGroup, RocketMQ Connect's worker start.
    pub const UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: i32 = 200;
    /// The dashboard's consumer list (every broker's groups).
    pub const GET_ALL_SUBSCRIPTIONGROUP_CONFIG: i32 = 201;
    /// Several groups' configs at once (mqadmin updateSubGroupList, an
    /// admin's createAndUpdateSubscriptionGroupConfigList).
    pub const UPDATE_AND_CREATE_SUBSCRIPTIONGROUP_LIST: i32 = 225;
    /// One group's config (an admin's examineSubscriptionGroupConfig).
    pub const GET_SUBSCRIPTIONGROUP_CONFIG: i32 = 352;
    /// The topics a group has committed offsets on (an admin's
    /// queryTopicsByConsumer, mqadmin consumerProgress).
    pub const QUERY_TOPICS_BY_CONSUMER: i32 = 343;
    /// A group's subscription to a topic, from its members' heartbeats.
    pub const QUERY_SUBSCRIPTION_BY_CONSUMER: i32 = 345;
    /// The dashboard's topic list: cluster and broker names (Apache lists
    /// them as "system topics").
    pub const GET_SYSTEM_TOPIC_LIST_FROM_NS: i32 = 304;
    /// mqadmin deleteSubGroup (with cleanOffset: the group's offsets too).
    pub const DELETE_SUBSCRIPTIONGROUP: i32 = 207;
    pub const GET_CONSUME_STATS: i32 = 208;
    pub const DELETE_TOPIC_IN_BROKER: i32 = 215;
    pub const DELETE_TOPIC_IN_NAMESRV: i32 = 216;
    /// Broker to client (oneway): move these queues to these offsets.
    pub const RESET_CONSUMER_CLIENT_OFFSET: i32 = 220;
    /// Admin to broker (mqadmin resetOffsetByTime): reset a group's offsets
    /// of a topic and tell its live consumers.
    pub const INVOKE_BROKER_TO_RESET_OFFSET: i32 = 222;
    pub const GET_KVLIST_BY_NAMESPACE: i32 = 219;
    pub const GET_TOPICS_BY_CLUSTER: i32 = 224;
    pub const QUERY_TOPIC_CONSUME_BY_WHO: i32 = 300;
    pub const ADD_WRITE_PERM_OF_BROKER: i32 = 327;
    pub const GET_TOPIC_CONFIG: i32 = 351;
    pub const SEND_MESSAGE_V2: i32 = 310;
    pub const SEND_BATCH_MESSAGE: i32 = 320;
    /// Request/reply: a responder's reply (V2: the short header names).
    pub const SEND_REPLY_MESSAGE: i32 = 324;
    pub const SEND_REPLY_MESSAGE_V2: i32 = 325;
    /// Broker to client: a reply to the request it sent.
    pub const PUSH_REPLY_MESSAGE_TO_CLIENT: i32 = 326;
    pub const LITE_PULL_MESSAGE: i32 = 361;
    /// RocketMQ 5's user admin (mqadmin createUser, updateUser, ...).
    pub const AUTH_CREATE_USER: i32 = 3001;
    pub const AUTH_UPDATE_USER: i32 = 3002;
    pub const AUTH_DELETE_USER: i32 = 3003;
    pub const AUTH_GET_USER: i32 = 3004;
    pub const AUTH_LIST_USERS: i32 = 3005;
    /// Rokka, between broker sets: a set's master joins a Kafka
    /// transaction another set coordinates (`remote_txns`).
    pub const ROKKA_TXN_JOIN: i32 = 32001;
    /// Rokka, between broker sets: a Kafka transaction's coordinator ends
    /// it on a participating set's master.
    pub const ROKKA_TXN_END: i32 = 32002;
}

pub mod response {
    pub const SUCCESS: i32 = 0;
    pub const SYSTEM_ERROR: i32 = 1;
    pub const SYSTEM_BUSY: i32 = 2;
    pub const REQUEST_CODE_NOT_SUPPORTED: i32 = 3;
    pub const NO_PERMISSION: i32 = 16;
    pub const TOPIC_NOT_EXIST: i32 = 17;
    pub const INVALID_PARAMETER: i32 = 29;
    pub const CONSUMER_NOT_ONLINE: i32 = 206;
    pub const PULL_NOT_FOUND: i32 = 19;
    pub const PULL_RETRY_IMMEDIATELY: i32 = 20;
    pub const PULL_OFFSET_MOVED: i32 = 21;
    pub const QUERY_NOT_FOUND: i32 = 22;
    pub const FLUSH_DISK_TIMEOUT: i32 = 10;
    pub const SLAVE_NOT_AVAILABLE: i32 = 11;
    pub const FLUSH_SLAVE_TIMEOUT: i32 = 12;
    pub const MESSAGE_ILLEGAL: i32 = 13;
    pub const SERVICE_NOT_AVAILABLE: i32 = 14;
}

/// The metric label for a request code: the number for codes Rokka knows,
/// `other` for the rest (a client may send any i32; each would otherwise
/// make a new time series).
/// A response code as a metric label: RocketMQ's ResponseCode values
/// 0..=30 and 200..=215 (the permission and filter ones) as text, `other` beyond.
pub fn response_label(code: i32) -> &'static str {
    static LABELS: std::sync::LazyLock<Vec<String>> =
        std::sync::LazyLock::new(|| (0..=30).chain(200..=215).map(|c: i32| c.to_string()).collect());
    let i = match code {
        0..=30 => code as usize,
        200..=215 => (code - 200 + 31) as usize,
        _ => return "other",
    };
    LABELS.get(i).map_or("other", String::as_str)
}

pub fn label(code: i32) -> &'static str {
    match code {
        10 => "10",
        11 => "11",
        12 => "12",
        14 => "14",
        15 => "15",
        17 => "17",
        21 => "21",
        28 => "28",
        29 => "29",
        30 => "30",
        31 => "31",
        32 => "32",
        33 => "33",
        34 => "34",
        35 => "35",
        36 => "36",
        37 => "37",
        38 => "38",
        39 => "39",
        40 => "40",
        41 => "41",
        42 => "42",
        100 => "100",
        101 => "101",
        102 => "102",
        103 => "103",
        104 => "104",
        105 => "105",
        106 => "106",
        202 => "202",
        203 => "203",
        204 => "204",
        205 => "205",
        206 => "206",
        208 => "208",
        207 => "207",
        215 => "215",
        216 => "216",
        219 => "219",
        220 => "220",
        222 => "222",
        224 => "224",
        300 => "300",
        310 => "310",
        320 => "320",
        324 => "324",
        325 => "325",
        327 => "327",
        351 => "351",
        361 => "361",
        3001 => "3001",
        3002 => "3002",
        3003 => "3003",
        3004 => "3004",
        3005 => "3005",
        32001 => "32001",
        32002 => "32002",
        _ => "other",
    }
}
