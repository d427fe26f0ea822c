//! Playing the upstream of the guest's gRPC streams: a test (or live mode, through the
//! bridge) delivers response headers, messages and the close, in the order and with the
//! callbacks Envoy 1.40 uses. Kept apart from `grpc`, the streams' state, because
//! delivering needs the running VM (`Host`), which itself holds that state.

use crate::abi::{count, pairs, Pair};
use crate::error::HarnessError;
use crate::grpc::{GrpcStream, UNAVAILABLE};
use crate::vm::Host;
use std::net::SocketAddr;

/// A message the guest sent on a stream: the stream's token and the bytes.
pub type StreamMessage = (u32, Vec<u8>);

/// The response headers of a gRPC stream, as Envoy's async client sees them.
fn default_initial_metadata() -> Vec<Pair> {
    pairs(&[(":status", "200"), ("content-type", "application/grpc")])
}

impl Host {
    pub fn grpc_streams(&self) -> &[GrpcStream] {
        &self.state().grpc.streams
    }

    pub fn grpc_stream(&self, token: u32) -> Option<&GrpcStream> {
        self.grpc_streams().iter().find(|s| s.token == token)
    }

    /// How many messages the guest has sent on all its streams.
    pub fn grpc_messages_sent(&self) -> usize {
        self.grpc_streams().iter().map(|s| s.messages.len()).sum()
    }

    /// Sends a request (`request`) and returns its stream id and the message it put on the
    /// guest's last gRPC stream, if one left meanwhile: the stream's token and the message.
    pub fn request_on_stream(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<(u32, Option<StreamMessage>), HarnessError> {
        let before = self.grpc_messages_sent();
        let (id, _) = self.request(method, path, headers)?;
        let sent = self.grpc_messages_sent() > before;
        let message = self
            .grpc_streams()
            .last()
            .filter(|_| sent)
            .and_then(|s| Some((s.token, s.messages.last()?.clone())));
        Ok((id, message))
    }

    /// The stream `context_id` opened last.
    pub fn grpc_stream_of(&self, context_id: u32) -> Option<&GrpcStream> {
        self.grpc_streams()
            .iter()
            .rev()
            .find(|s| s.context_id == context_id)
    }

    fn grpc_stream_mut(&mut self, token: u32) -> Result<&mut GrpcStream, HarnessError> {
        self.state_mut()
            .grpc
            .get_mut(token)
            .ok_or_else(|| HarnessError::Usage(format!("no gRPC stream {token}")))
    }

    /// The stream the upstream may still send on, or a usage error.
    fn readable(&mut self, token: u32) -> Result<&mut GrpcStream, HarnessError> {
        let stream = self.grpc_stream_mut(token)?;
        if !stream.readable() {
            return Err(HarnessError::Usage(format!(
                "gRPC stream {token} cannot receive: cancelled {}, remote close {:?}",
                stream.guest_cancelled, stream.remote_close
            )));
        }
        Ok(stream)
    }

    /// Delivers the response headers of stream `token` (once, before any message), with
    /// `:status: 200` in front as Envoy's map has it.
    pub fn grpc_initial_metadata(
        &mut self,
        token: u32,
        headers: &[(&str, &str)],
    ) -> Result<(), HarnessError> {
        let mut all = pairs(&[(":status", "200")]);
        all.extend(pairs(headers));
        self.deliver_initial_metadata(token, all)
    }

    fn deliver_initial_metadata(
        &mut self,
        token: u32,
        metadata: Vec<Pair>,
    ) -> Result<(), HarnessError> {
        let stream = self.readable(token)?;
        if stream.initial_metadata_delivered {
            return Err(HarnessError::Usage(format!(
                "gRPC stream {token} already has its initial metadata"
            )));
        }
        stream.initial_metadata_delivered = true;
        let n = count(metadata.len());
        self.state_mut().grpc.initial_metadata = Some(metadata);
        let result = self.grpc_callback("proxy_on_grpc_receive_initial_metadata", token, n);
        self.state_mut().grpc.initial_metadata = None;
        result
    }

    /// Delivers one message from the upstream on stream `token` (the first one preceded by
    /// the response headers, as Envoy does when they arrive); the guest reads it as
    /// buffer type 5 during `proxy_on_grpc_receive`.
    pub fn grpc_message(&mut self, token: u32, message: &[u8]) -> Result<(), HarnessError> {
        self.event(|host| {
            if !host.readable(token)?.initial_metadata_delivered {
                host.deliver_initial_metadata(token, default_initial_metadata())?;
                if host.cancelled(token) {
                    return Ok(());
                }
            }
            host.state_mut().grpc.receive = Some(message.to_vec());
            let result = host.grpc_callback("proxy_on_grpc_receive", token, count(message.len()));
            host.state_mut().grpc.receive = None;
            result
        })
    }

    /// The upstream closes stream `token` with gRPC `status` and `message`: trailing
    /// metadata, then `proxy_on_grpc_close` during which `proxy_get_status` answers both.
    /// Before any response headers this is a trailers-only response: Envoy first delivers
    /// empty initial metadata and hands the headers over as the trailers.
    pub fn grpc_remote_close(
        &mut self,
        token: u32,
        status: u32,
        message: &str,
    ) -> Result<(), HarnessError> {
        self.event(|host| {
            let trailers_only = !host.readable(token)?.initial_metadata_delivered;
            if trailers_only {
                host.deliver_initial_metadata(token, Vec::new())?;
                if host.cancelled(token) {
                    return Ok(());
                }
            }
            let mut trailers = if trailers_only {
                default_initial_metadata()
            } else {
                Vec::new()
            };
            trailers.extend(pairs(&[("grpc-status", &status.to_string())]));
            if !message.is_empty() {
                trailers.extend(pairs(&[("grpc-message", message)]));
            }
            // Envoy marks the stream remotely closed before the callbacks run.
            host.readable(token)?.remote_close = Some((status, message.to_owned()));
            let n = count(trailers.len());
            host.state_mut().grpc.trailing_metadata = Some(trailers);
            let result = host.grpc_callback("proxy_on_grpc_receive_trailing_metadata", token, n);
            host.state_mut().grpc.trailing_metadata = None;
            result?;
            if host.cancelled(token) {
                return Ok(());
            }
            host.state_mut().last_status = (status, message.as_bytes().to_vec());
            let result = host.grpc_callback("proxy_on_grpc_close", token, status as i32);
            host.state_mut().last_status = (0, Vec::new());
            result
        })
    }

    /// Whether the guest cancelled `token`, perhaps in a callback: Envoy resets the stream
    /// and delivers nothing more, not even the rest of the event under way.
    fn cancelled(&self, token: u32) -> bool {
        self.grpc_stream(token).is_none_or(|s| s.guest_cancelled)
    }

    /// Runs a stream callback on the root context, as Envoy does.
    fn grpc_callback(
        &mut self,
        name: &'static str,
        token: u32,
        arg: i32,
    ) -> Result<(), HarnessError> {
        let root = self.root_id()?;
        let params = (root as i32, token as i32, arg);
        self.call::<(i32, i32, i32), ()>(name, root, params)
            .map(|_| ())
    }

    /// Live mode: forwards each message the guest sent on stream `token` and not yet
    /// forwarded to the bridge at `addr` (`id\n` + batch → `POST /v1/check`), delivering
    /// `id\n` + the reply body; an unreachable bridge or a non-200 reply closes the stream
    /// with `UNAVAILABLE`. Messages the guest sends meanwhile are forwarded too. Returns how
    /// many replies reached the guest.
    pub fn forward_grpc(&mut self, token: u32, addr: SocketAddr) -> Result<usize, HarnessError> {
        let mut replies = 0;
        loop {
            let stream = self.grpc_stream_mut(token)?;
            if !stream.readable() {
                return Ok(replies);
            }
            let Some(message) = stream.messages.get(stream.forwarded).cloned() else {
                return Ok(replies);
            };
            stream.forwarded += 1;
            let upstream = stream.upstream.clone();
            match crate::live::forward_message(addr, &upstream, &message) {
                Ok(reply) => {
                    self.grpc_message(token, &reply)?;
                    replies += 1;
                }
                Err(reason) => {
                    self.grpc_remote_close(token, UNAVAILABLE, &reason)?;
                    return Ok(replies);
                }
            }
        }
    }
}
