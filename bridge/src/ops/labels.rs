//! The values the bridge's own series are labelled with, each from the bridge's code, never
//! from a client's input: how a check ended, how an exchange came, why an exchange, a
//! stream or a connection was refused or cut short, and what kind of Redis failure a
//! script call met. `metrics` makes one series of each value from the start.

use redis::{ErrorKind, RedisError, ServerErrorKind};

/// How one check of an exchange ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Every rule admitted it.
    Allowed,
    /// A rule denied it (or its client is blocked).
    Denied,
    /// Redis failed: the gateway applies its failure mode.
    Failed,
    /// The bridge would not run it: an unreadable line, a key outside its prefixes.
    Refused,
}

/// How an exchange reached the bridge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// `POST /v1/check`.
    Http,
    /// A message on the gRPC stream.
    Grpc,
}

/// Why an exchange, a stream or a connection was refused or cut short (`failures_total`).
/// A check's own failures are counted in `checks_total`; Redis's in
/// `script_call_failures_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// A check or a stream without the gateways' token (401).
    Unauthorized,
    /// A body that is no batch at all (400, or a failed line on the stream).
    BadBatch,
    /// A body past the bound (413).
    TooLarge,
    /// A body that could not be read: a reset, a broken chunk (400).
    Unreadable,
    /// A body that did not arrive within the body timeout (408).
    BodyTimeout,
    /// Something other than gRPC on the stream's path (415).
    NotGrpc,
    /// A stream message the bridge cannot read (the stream ends INVALID_ARGUMENT).
    BadMessage,
    /// A stream message that did not arrive whole in time (DEADLINE_EXCEEDED).
    MessageTimeout,
    /// A connection closed at once: `--max-connections` were open, every one had checked.
    OverCapacity,
    /// A connection that had not checked, closed to make room for a new one.
    Evicted,
    /// A connection closed because an answer waited `--write-timeout-ms` for its peer.
    WriteTimeout,
}

impl Failure {
    /// Every kind, in the order `metrics` registers them.
    pub const ALL: [Failure; 11] = [
        Failure::Unauthorized,
        Failure::BadBatch,
        Failure::TooLarge,
        Failure::Unreadable,
        Failure::BodyTimeout,
        Failure::NotGrpc,
        Failure::BadMessage,
        Failure::MessageTimeout,
        Failure::OverCapacity,
        Failure::Evicted,
        Failure::WriteTimeout,
    ];

    /// The `kind` label.
    pub fn kind(self) -> &'static str {
        match self {
            Failure::Unauthorized => "unauthorized",
            Failure::BadBatch => "bad_batch",
            Failure::TooLarge => "too_large",
            Failure::Unreadable => "unreadable",
            Failure::BodyTimeout => "body_timeout",
            Failure::NotGrpc => "not_grpc",
            Failure::BadMessage => "bad_message",
            Failure::MessageTimeout => "message_timeout",
            Failure::OverCapacity => "over_capacity",
            Failure::Evicted => "evicted",
            Failure::WriteTimeout => "write_timeout",
        }
    }
}

/// The `kind` a failed Redis command is counted under in `script_call_failures_total`.
pub fn redis_failure(e: &RedisError) -> &'static str {
    if e.is_timeout() {
        return "timeout";
    }
    // Redis at `maxmemory` that may not evict (`noeviction`): every write fails, so every
    // check does, until memory is freed. redis-rs knows no such kind (an extension error).
    if e.code() == Some("OOM") {
        return "oom";
    }
    match e.kind() {
        ErrorKind::Io => "io",
        ErrorKind::AuthenticationFailed => "auth",
        ErrorKind::ClusterConnectionNotFound => "no_connection",
        ErrorKind::MasterNameNotFoundBySentinel => "no_master",
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType => "reply",
        ErrorKind::Server(ServerErrorKind::NoScript) => "noscript",
        ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask) => "moved",
        ErrorKind::Server(
            ServerErrorKind::TryAgain | ServerErrorKind::ClusterDown | ServerErrorKind::MasterDown,
        ) => "clusterdown",
        ErrorKind::Server(ServerErrorKind::BusyLoading) => "loading",
        ErrorKind::Server(ServerErrorKind::NoPerm) => "noperm",
        ErrorKind::Server(ServerErrorKind::ReadOnly) => "readonly",
        ErrorKind::Server(_) => "server",
        _ => "client",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_errors_are_counted_by_kind() {
        let io = |kind| RedisError::from(std::io::Error::new(kind, "x"));
        assert_eq!(redis_failure(&io(std::io::ErrorKind::TimedOut)), "timeout");
        assert_eq!(
            redis_failure(&io(std::io::ErrorKind::ConnectionReset)),
            "io"
        );
        let server = |kind| RedisError::from((ErrorKind::Server(kind), "x"));
        assert_eq!(
            redis_failure(&server(ServerErrorKind::NoScript)),
            "noscript"
        );
        assert_eq!(redis_failure(&server(ServerErrorKind::Moved)), "moved");
        assert_eq!(
            redis_failure(&server(ServerErrorKind::ResponseError)),
            "server"
        );
        let oom = redis::make_extension_error(
            "OOM".into(),
            Some("command not allowed when used memory > 'maxmemory'.".into()),
        );
        assert_eq!(redis_failure(&oom), "oom");
    }
}
