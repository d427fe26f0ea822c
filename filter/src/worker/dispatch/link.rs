//! What the dispatcher asks of the host besides the request it reads (`host::Proxy`): one
//! interface for every way an exchange travels (a message on the worker's gRPC stream, an
//! HTTP callout, Higress's redis call), the worker's timer, and its metrics. The glue
//! implements it over the ABI; the dispatcher's tests over a recording fake.

use crate::wire::redis_call::Invoke;
use ratelimit_config::backend::Backend;
use std::time::Duration;

pub trait Link {
    /// Sends exchange `id` (`body`, its lines) on the open stream `token`; its reply comes
    /// to `Dispatcher::stream_message`.
    fn stream_send(&mut self, token: u32, id: u32, body: &str) -> Result<(), String>;
    /// Sends `body` as an HTTP callout to the bridge; the token its reply will name (to
    /// the context running now).
    fn callout(&mut self, backend: &Backend, body: &str) -> Result<u32, String>;
    /// Sends `body` as one script call on Redis (the redis-call build); the token its
    /// reply will name. A build without the redis call answers an error.
    fn redis_call(&mut self, backend: &Backend, body: &str, invoke: Invoke) -> Result<u32, String>;
    /// Opens the worker's stream to the bridge: its token.
    fn open_stream(&mut self, backend: &Backend) -> Result<u32, String>;
    /// Closes a stream (one the host already closed is fine).
    fn close_stream(&mut self, token: u32);
    /// Asks the host to call `Dispatcher::wake` right after the current callback; `false`
    /// where it cannot, and the dispatcher wakes with a short tick instead.
    fn post_wake(&mut self) -> bool;
    fn set_tick(&mut self, period: Duration);
    /// A counter's metric id (the host hands back the existing one for a name it knows).
    fn define_counter(&mut self, name: &str) -> Option<u32>;
    fn add_to_counter(&mut self, id: u32, n: u64);
}
