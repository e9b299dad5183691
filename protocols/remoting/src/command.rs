//! The remoting command: what a frame's header and body carry.

use bytes::Bytes;

/// Bit 0 of `flag`: this is a response.
pub const FLAG_RESPONSE: i32 = 1;
/// Bit 1 of `flag`: the request wants no response.
pub const FLAG_ONEWAY: i32 = 2;

/// How the header is serialized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SerializeType {
    #[default]
    Json,
    RocketMq,
}

/// The sender's language (`LanguageCode.java`: names and byte codes 0..13).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LanguageCode {
    #[default]
    Java,
    Cpp,
    Dotnet,
    Python,
    Delphi,
    Erlang,
    Ruby,
    Other,
    Http,
    Go,
    Php,
    Oms,
    Rust,
    NodeJs,
}

const LANGUAGES: [(LanguageCode, &str); 14] = [
    (LanguageCode::Java, "JAVA"),
    (LanguageCode::Cpp, "CPP"),
    (LanguageCode::Dotnet, "DOTNET"),
    (LanguageCode::Python, "PYTHON"),
    (LanguageCode::Delphi, "DELPHI"),
    (LanguageCode::Erlang, "ERLANG"),
    (LanguageCode::Ruby, "RUBY"),
    (LanguageCode::Other, "OTHER"),
    (LanguageCode::Http, "HTTP"),
    (LanguageCode::Go, "GO"),
    (LanguageCode::Php, "PHP"),
    (LanguageCode::Oms, "OMS"),
    (LanguageCode::Rust, "RUST"),
    (LanguageCode::NodeJs, "NODE_JS"),
];

impl LanguageCode {
    pub fn code(self) -> u8 {
        LANGUAGES.iter().position(|(l, _)| *l == self).unwrap_or(7) as u8
    }

    pub fn name(self) -> &'static str {
        LANGUAGES.iter().find(|(l, _)| *l == self).map_or("OTHER", |(_, n)| n)
    }

    /// Unknown codes are OTHER, as the digest advises.
    pub fn from_code(c: u8) -> LanguageCode {
        LANGUAGES.get(c as usize).map_or(LanguageCode::Other, |(l, _)| *l)
    }

    pub fn from_name(n: &str) -> LanguageCode {
        LANGUAGES
            .iter()
            .find(|(_, name)| *name == n)
            .map_or(LanguageCode::Other, |(l, _)| *l)
    }
}

/// An extFields key. The names clients send on every request are borrowed
/// from a table ([`field_name`]), so reading a header allocates no string
/// for them; others are owned.
pub type FieldName = std::borrow::Cow<'static, str>;

/// `k` as a [`FieldName`]: borrowed when it is a name of the table (the
/// fields the broker reads and the clients' common ones, SEND_MESSAGE_V2's
/// one-letter names among them).
pub fn field_name(k: &str) -> FieldName {
    macro_rules! table {
        ($($name:literal),* $(,)?) => {
            match k {
                $($name => FieldName::Borrowed($name),)*
                _ => FieldName::Owned(k.to_owned()),
            }
        };
    }
    table!(
        "AccessKey",
        "Signature",
        "a",
        "b",
        "batch",
        "bname",
        "bodyCrc32",
        "bornHost",
        "bornTimestamp",
        "brokerAddr",
        "brokerId",
        "brokerName",
        "c",
        "clientID",
        "clusterName",
        "commitLogOffset",
        "commitOffset",
        "commitOrRollback",
        "compressed",
        "consumerGroup",
        "d",
        "defaultTopic",
        "defaultTopicQueueNums",
        "delayLevel",
        "e",
        "enableActingMaster",
        "expressionType",
        "f",
        "flag",
        "fromTransactionCheck",
        "g",
        "group",
        "groupSysFlag",
        "h",
        "haServerAddr",
        "i",
        "j",
        "k",
        "l",
        "m",
        "masterAddr",
        "maxMsgBytes",
        "maxMsgNums",
        "maxOffset",
        "maxReconsumeTimes",
        "minOffset",
        "msgId",
        "n",
        "nextBeginOffset",
        "offset",
        "originMsgId",
        "originTopic",
        "producerGroup",
        "properties",
        "queueId",
        "queueOffset",
        "reconsumeTimes",
        "storeHost",
        "subVersion",
        "subscription",
        "suggestWhichBrokerId",
        "suspendTimeoutMillis",
        "sysFlag",
        "timestamp",
        "topic",
        "topicSysFlag",
        "tranStateTableOffset",
        "transactionId",
        "unitMode",
    )
}

/// `extFields`: string → string in the sender's order (kept, so a binary
/// header re-encodes to the same bytes).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExtFields(pub Vec<(FieldName, String)>);

impl ExtFields {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// Sets `key`, replacing an existing value.
    pub fn set(&mut self, key: &str, value: impl Into<String>) {
        let value = value.into();
        match self.0.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.0.push((field_name(key), value)),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }
}

/// One request or response.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RemotingCommand {
    /// Request code, or response code in a response.
    pub code: i32,
    pub language: LanguageCode,
    /// The sender's `MQVersion` ordinal.
    pub version: i32,
    /// Request id; a response echoes it.
    pub opaque: i32,
    pub flag: i32,
    pub remark: Option<String>,
    pub ext_fields: ExtFields,
    pub serialize_type: SerializeType,
    pub body: Bytes,
}

impl RemotingCommand {
    /// A request.
    pub fn request(code: i32, opaque: i32) -> RemotingCommand {
        RemotingCommand {
            code,
            opaque,
            ..RemotingCommand::default()
        }
    }

    pub fn is_response(&self) -> bool {
        self.flag & FLAG_RESPONSE != 0
    }

    pub fn is_oneway(&self) -> bool {
        self.flag & FLAG_ONEWAY != 0
    }

    /// The response skeleton for this request: same opaque and serialize
    /// type, the response flag, `version` = ours.
    pub fn response(&self, code: i32, version: i32) -> RemotingCommand {
        RemotingCommand {
            code,
            language: LanguageCode::Java,
            version,
            opaque: self.opaque,
            flag: FLAG_RESPONSE,
            serialize_type: self.serialize_type,
            ..RemotingCommand::default()
        }
    }
}

#[cfg(test)]
mod field_name_tests {
    use super::*;

    #[test]
    fn known_field_names_are_borrowed_others_owned() {
        assert!(matches!(field_name("topic"), FieldName::Borrowed("topic")));
        assert!(matches!(field_name("a"), FieldName::Borrowed("a")));
        assert!(matches!(field_name("zz"), FieldName::Owned(ref o) if o == "zz"));
        let mut e = ExtFields::default();
        e.set("queueId", "3");
        e.set("custom", "x");
        assert_eq!((e.get("queueId"), e.get("custom")), (Some("3"), Some("x")));
    }
}
