//! A worker's events and the exchanges its checks travel in: what one Envoy worker keeps
//! across its requests and configurations, owned in one place.
//!
//! A layer of its own because this is where the filter meets time and events: requests
//! pause and resume, exchanges go out and come back (or time out on a tick), the stream
//! closes and reopens, a new configuration takes over under requests in flight. The
//! decisions below know nothing of that; the glue above only turns the host's callbacks
//! into these events and carries the verdicts out.
//!
//! Bottom to top: `exchange` (group commit: the exchanges in flight and the checks
//! waiting), `settlements` (metered rules' settlements until applied), `slots` (requests
//! holding in-flight slots: renewed while they live, released when they end), `dispatch` (the
//! dispatcher: events in, verdicts and `dispatch::Link` calls
//! out; `dispatch::requests` and `dispatch::replies`, its events; `dispatch::link`, what
//! it asks of the host), `stage` (where a request stands as its hooks see it, for every
//! binding).

pub mod dispatch;
pub mod exchange;
pub mod settlements;
pub mod slots;
pub mod stage;
