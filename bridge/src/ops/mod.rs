//! Operations: what an operator watches of the bridge, and what the operator hands it at
//! start. Below every other folder: the store and the doors record their series here, and
//! TLS on either side (to Redis, on the bridge's own port, to an xDS server) reads its
//! files through `pem`. Serving the series is a door's (`doors::probes`); each flag
//! belongs to what it configures.
//!
//! - `labels`: the values the series are labelled with: a check's outcome, an exchange's
//!   transport, a failure's kind, a Redis error's kind.
//! - `metrics`: the Prometheus registry behind `GET /metrics`, one per store.
//! - `pem`: PEM files named by flags (certificates, keys, CA bundles), checked at startup.

pub mod labels;
pub mod metrics;
pub mod pem;
