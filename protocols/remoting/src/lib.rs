//! RocketMQ remoting: the frame codec (`shared/protocols/rocketmq-remoting.md`
//! §1). No I/O and no tokio: bytes in, [`RemotingCommand`]s out, and back.
//!
//! A frame is `length:u32 | headerWord:u32 | header | body`, where the top
//! byte of the header word is the serialize type (0 JSON, 1 ROCKETMQ binary)
//! and the low 24 bits the header length. Decoding is lenient where real
//! clients differ (numbers for strings, missing fields, unknown keys, a
//! trailing newline after the JSON header) and strict where a mistake would
//! misframe the stream (lengths).

mod codec;
pub mod codes;
mod command;

pub use codec::{decode, encode, FrameError, DEFAULT_MAX_FRAME};
pub use command::{ExtFields, LanguageCode, RemotingCommand, SerializeType, FLAG_ONEWAY, FLAG_RESPONSE};
