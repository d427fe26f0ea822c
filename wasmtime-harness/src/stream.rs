//! Driving HTTP streams through the guest, and delivering what the world answers: callout
//! replies (given by the test, failed, timed out, or fetched live) and redis replies.

use crate::abi::{count, pairs, Action, Pair, Status};
use crate::callout::{CallResponse, Callout, CalloutState};
use crate::error::HarnessError;
use crate::state::Stream;
use crate::vm::Host;
use std::net::SocketAddr;

impl Host {
    /// Creates an HTTP context (`proxy_on_context_create` under the root); returns its id.
    pub fn new_stream(&mut self) -> Result<u32, HarnessError> {
        let root = self.root_id()?;
        let state = self.state_mut();
        let id = state.next_context_id;
        state.next_context_id += 1;
        state.streams.insert(id, Stream::default());
        self.call::<(i32, i32), ()>("proxy_on_context_create", id, (id as i32, root as i32))?;
        Ok(id)
    }

    pub fn stream(&self, id: u32) -> Result<&Stream, HarnessError> {
        self.state()
            .streams
            .get(&id)
            .ok_or_else(|| HarnessError::Usage(format!("no stream {id}")))
    }

    fn stream_mut(&mut self, id: u32) -> Result<&mut Stream, HarnessError> {
        self.state_mut()
            .streams
            .get_mut(&id)
            .ok_or_else(|| HarnessError::Usage(format!("no stream {id}")))
    }

    /// Sets a property for this stream only (`["source", "address"]`, ...).
    pub fn set_stream_property(
        &mut self,
        id: u32,
        path: &[&str],
        value: &[u8],
    ) -> Result<(), HarnessError> {
        let key = path.iter().map(|s| s.as_bytes().to_vec()).collect();
        self.stream_mut(id)?.properties.insert(key, value.to_vec());
        Ok(())
    }

    fn action(
        &mut self,
        name: &'static str,
        id: u32,
        params: (i32, i32, i32),
    ) -> Result<Action, HarnessError> {
        let code = self.call::<(i32, i32, i32), i32>(name, id, params)?;
        Ok(Action::from_code(code.unwrap_or(0)))
    }

    /// `proxy_on_request_headers` with `headers` (raw bytes, for hostile values).
    pub fn request_headers_raw(
        &mut self,
        id: u32,
        headers: Vec<Pair>,
        end_of_stream: bool,
    ) -> Result<Action, HarnessError> {
        let n = count(headers.len());
        self.stream_mut(id)?.request_headers = headers;
        self.action(
            "proxy_on_request_headers",
            id,
            (id as i32, n, i32::from(end_of_stream)),
        )
    }

    pub fn request_headers(
        &mut self,
        id: u32,
        headers: &[(&str, &str)],
        end_of_stream: bool,
    ) -> Result<Action, HarnessError> {
        self.request_headers_raw(id, pairs(headers), end_of_stream)
    }

    /// Appends `chunk` to the request body and runs `proxy_on_request_body`.
    pub fn request_body(
        &mut self,
        id: u32,
        chunk: &[u8],
        end_of_stream: bool,
    ) -> Result<Action, HarnessError> {
        let stream = self.stream_mut(id)?;
        stream.request_body.extend_from_slice(chunk);
        let n = count(stream.request_body.len());
        self.action(
            "proxy_on_request_body",
            id,
            (id as i32, n, i32::from(end_of_stream)),
        )
    }

    pub fn request_trailers(
        &mut self,
        id: u32,
        trailers: &[(&str, &str)],
    ) -> Result<Action, HarnessError> {
        let trailers = pairs(trailers);
        let n = count(trailers.len());
        self.stream_mut(id)?.request_trailers = trailers;
        let code = self.call::<(i32, i32), i32>("proxy_on_request_trailers", id, (id as i32, n))?;
        Ok(Action::from_code(code.unwrap_or(0)))
    }

    pub fn response_headers(
        &mut self,
        id: u32,
        headers: &[(&str, &str)],
        end_of_stream: bool,
    ) -> Result<Action, HarnessError> {
        let headers = pairs(headers);
        let n = count(headers.len());
        self.stream_mut(id)?.response_headers = headers;
        self.action(
            "proxy_on_response_headers",
            id,
            (id as i32, n, i32::from(end_of_stream)),
        )
    }

    /// A chunk of the response body. As in Envoy, the buffer the filter reads holds what
    /// it paused on so far (`Action::Pause` buffers), or only this chunk once it let the
    /// earlier ones through.
    pub fn response_body(
        &mut self,
        id: u32,
        chunk: &[u8],
        end_of_stream: bool,
    ) -> Result<Action, HarnessError> {
        let stream = self.stream_mut(id)?;
        stream.response_body.extend_from_slice(chunk);
        let n = count(stream.response_body.len());
        let action = self.action(
            "proxy_on_response_body",
            id,
            (id as i32, n, i32::from(end_of_stream)),
        )?;
        if action == Action::Continue {
            self.stream_mut(id)?.response_body.clear();
        }
        Ok(action)
    }

    /// Ends the stream as Envoy does: `proxy_on_done`, `proxy_on_log`, `proxy_on_delete`.
    pub fn finish_stream(&mut self, id: u32) -> Result<(), HarnessError> {
        self.event(|host| {
            host.stream(id)?;
            host.call::<i32, i32>("proxy_on_done", id, id as i32)?;
            host.call::<i32, ()>("proxy_on_log", id, id as i32)?;
            host.call::<i32, ()>("proxy_on_delete", id, id as i32)?;
            host.stream_mut(id)?.deleted = true;
            Ok(())
        })
    }

    /// A new stream carrying a request with `method`, `path` and extra `headers`.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<(u32, Action), HarnessError> {
        let mut all = pairs(&[
            (":method", method),
            (":path", path),
            (":authority", "example.com"),
            (":scheme", "http"),
        ]);
        all.extend(pairs(headers));
        self.event(|host| {
            let id = host.new_stream()?;
            let action = host.request_headers_raw(id, all, true)?;
            Ok((id, action))
        })
    }

    pub fn callouts(&self) -> &[Callout] {
        &self.state().callouts
    }

    /// The callout `id` dispatched last.
    pub fn callout_of(&self, id: u32) -> Option<&Callout> {
        self.callouts().iter().rev().find(|c| c.context_id == id)
    }

    fn take_pending(&mut self, token: u32, outcome: CalloutState) -> Result<Callout, HarnessError> {
        let callout = self
            .state_mut()
            .callouts
            .iter_mut()
            .find(|c| c.token == token)
            .ok_or_else(|| HarnessError::Usage(format!("no callout {token}")))?;
        if callout.state != CalloutState::Pending {
            return Err(HarnessError::Usage(format!(
                "callout {token} already ended: {:?}",
                callout.state
            )));
        }
        callout.state = outcome;
        Ok(callout.clone())
    }

    fn deliver(
        &mut self,
        callout: &Callout,
        reply: Option<CallResponse>,
    ) -> Result<(), HarnessError> {
        let (h, b, t) = reply.as_ref().map_or((0, 0, 0), |r| {
            (
                count(r.headers.len()),
                count(r.body.len()),
                count(r.trailers.len()),
            )
        });
        self.state_mut().call_response = reply;
        let ctx = callout.context_id;
        let result = self.call::<(i32, i32, i32, i32, i32), ()>(
            "proxy_on_http_call_response",
            ctx,
            (ctx as i32, callout.token as i32, h, b, t),
        );
        let state = self.state_mut();
        state.call_response = None;
        state.last_status = (0, Vec::new());
        result.map(|_| ())
    }

    /// Answers callout `token` with `reply`.
    pub fn answer(&mut self, token: u32, reply: CallResponse) -> Result<(), HarnessError> {
        let status = reply.status().unwrap_or(0);
        let callout = self.take_pending(token, CalloutState::Answered { status })?;
        self.deliver(&callout, Some(reply))
    }

    /// Fails callout `token` as Envoy reports a reset: zero headers, zero body, no reply
    /// header map, and `proxy_get_status` saying "reset".
    pub fn fail_callout(&mut self, token: u32) -> Result<(), HarnessError> {
        let callout = self.take_pending(token, CalloutState::Failed)?;
        self.state_mut().last_status = (Status::BrokenConnection.code() as u32, b"reset".to_vec());
        self.deliver(&callout, None)
    }

    /// Times callout `token` out now: Envoy's router answers it with a 504.
    pub fn time_out_callout(&mut self, token: u32) -> Result<(), HarnessError> {
        let callout = self.take_pending(token, CalloutState::TimedOut)?;
        self.deliver(&callout, Some(CallResponse::envoy_timeout()))
    }

    /// Live mode: sends callout `token` to the bridge at `addr` and delivers its reply.
    pub fn forward(&mut self, token: u32, addr: SocketAddr) -> Result<CallResponse, HarnessError> {
        let callout = self
            .callouts()
            .iter()
            .find(|c| c.token == token)
            .cloned()
            .ok_or_else(|| HarnessError::Usage(format!("no callout {token}")))?;
        let reply = crate::live::forward(addr, &callout);
        if reply == CallResponse::envoy_timeout() {
            self.time_out_callout(token)?;
        } else {
            self.answer(token, reply.clone())?;
        }
        Ok(reply)
    }

    /// Delivers `reply` (raw RESP) to redis call `token` on the root context.
    pub fn answer_redis(
        &mut self,
        token: u32,
        status: i32,
        reply: &[u8],
    ) -> Result<(), HarnessError> {
        let root = self.root_id()?;
        let call = self
            .state_mut()
            .redis
            .calls
            .iter_mut()
            .find(|c| c.token == token && !c.answered)
            .ok_or_else(|| HarnessError::Usage(format!("no pending redis call {token}")))?;
        call.answered = true;
        self.state_mut().redis.reply = Some(reply.to_vec());
        let params = (root as i32, token as i32, status, count(reply.len()));
        let result =
            self.call::<(i32, i32, i32, i32), ()>("proxy_on_redis_call_response", root, params);
        self.state_mut().redis.reply = None;
        result.map(|_| ())
    }

    /// Live mode: runs redis call `token` on the Redis at `addr`; a failure is delivered
    /// with a non-zero status and no reply.
    pub fn forward_redis(&mut self, token: u32, addr: SocketAddr) -> Result<Vec<u8>, HarnessError> {
        let state = self.state();
        let call = state
            .redis
            .calls
            .iter()
            .find(|c| c.token == token)
            .ok_or_else(|| HarnessError::Usage(format!("no redis call {token}")))?;
        let timeout = state
            .redis
            .clusters
            .iter()
            .find(|k| k.name == call.cluster)
            .map_or(1000, |k| u64::from(k.timeout_ms.max(1)));
        let query = call.query.clone();
        match crate::live::execute_redis(addr, &query, std::time::Duration::from_millis(timeout)) {
            Ok(reply) => {
                self.answer_redis(token, 0, &reply)?;
                Ok(reply)
            }
            Err(_) => {
                self.answer_redis(token, Status::BrokenConnection.code(), b"")?;
                Ok(Vec::new())
            }
        }
    }
}
