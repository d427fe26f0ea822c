//! A loaded VM and the callbacks into it, with the lifecycle Envoy follows: `_initialize`,
//! root context, `proxy_on_vm_start`, `proxy_on_configure`, ticks; and the event loop
//! around them, which delivers the shared-queue notifications an event posted once it is
//! over. What drives the VM (streams, callouts, gRPC, the clock) is built on this.
//!
//! Every callback runs with a fresh fuel budget and its cost is recorded; a trap becomes a
//! `HarnessError::Trap` carrying the guest's last log lines, and the VM is marked failed.

use crate::error::{HarnessError, TRAP_LOG_LINES};
use crate::hostcalls::{self, wasi::ProcExit};
use crate::queue::{SharedQueue, MAX_POSTED_PER_EVENT};
use crate::state::{FuelRecord, HostState};
use crate::wasm::Wasm;
use wasmtime::{Instance, Linker, Store, WasmParams, WasmResults};

pub struct Host {
    pub(crate) store: Store<HostState>,
    instance: Instance,
    unserved: Vec<String>,
    /// The first trap, after which Envoy stops calling the VM.
    failed: Option<String>,
    /// Driving calls under way: posted notifications wait until the outermost returns.
    depth: u32,
}

impl Host {
    /// Instantiates the module and runs its `_initialize` (or `_start`).
    pub fn new(wasm: &Wasm) -> Result<Host, HarnessError> {
        Host::with_state(wasm, HostState::default())
    }

    /// As `new`, with prepared host state (argv, environment, clusters...).
    pub fn with_state(wasm: &Wasm, state: HostState) -> Result<Host, HarnessError> {
        let load = |e: wasmtime::Error| HarnessError::Load(format!("{e:#}"));
        let mut store = Store::new(&wasm.engine, state);
        let mut linker = Linker::new(&wasm.engine);
        hostcalls::link(&mut linker).map_err(load)?;
        let unserved =
            hostcalls::stub_unserved(&mut linker, &mut store, &wasm.module).map_err(load)?;
        hostcalls::make_refusable(&mut linker, &mut store, &wasm.module).map_err(load)?;
        let fuel = store.data().fuel_per_call;
        store.set_fuel(fuel).map_err(load)?;
        let instance = linker.instantiate(&mut store, &wasm.module).map_err(load)?;
        let memory = instance.get_memory(&mut store, "memory");
        let allocate = instance
            .get_typed_func::<i32, i32>(&mut store, "proxy_on_memory_allocate")
            .ok();
        store.data_mut().memory = memory;
        store.data_mut().allocate = allocate;
        let mut host = Host {
            store,
            instance,
            unserved,
            failed: None,
            depth: 0,
        };
        if host.call::<(), ()>("_initialize", 0, ())?.is_none() {
            host.call::<(), ()>("_start", 0, ())?;
        }
        Ok(host)
    }

    /// Imports the harness does not serve (`module.name`); calling one traps with its name.
    pub fn unserved_imports(&self) -> &[String] {
        &self.unserved
    }

    /// Whether the module exports `name`.
    pub fn exports(&mut self, name: &str) -> bool {
        self.instance.get_export(&mut self.store, name).is_some()
    }

    pub fn state(&self) -> &HostState {
        self.store.data()
    }

    pub fn state_mut(&mut self) -> &mut HostState {
        self.store.data_mut()
    }

    /// Calls export `name` on behalf of `context_id`; `Ok(None)` if the guest lacks it
    /// (Envoy skips missing callbacks). Notifications it posts (shared-queue enqueues) are
    /// delivered once it returns, unless a driving call around it is still under way.
    pub fn call<P: WasmParams, R: WasmResults>(
        &mut self,
        name: &'static str,
        context_id: u32,
        params: P,
    ) -> Result<Option<R>, HarnessError> {
        self.event(|host| host.call_guest(name, context_id, params))
    }

    /// Runs `drive` as one event of the proxy's event loop: when the outermost event
    /// returns, the notifications its callbacks posted are delivered, as Envoy's dispatcher
    /// runs posted work after the current event.
    pub(crate) fn event<T>(
        &mut self,
        drive: impl FnOnce(&mut Host) -> Result<T, HarnessError>,
    ) -> Result<T, HarnessError> {
        self.depth += 1;
        let result = drive(self);
        self.depth -= 1;
        let value = result?;
        if self.depth == 0 {
            self.deliver_posted()?;
        }
        Ok(value)
    }

    pub fn shared_queues(&self) -> &[SharedQueue] {
        &self.state().queues.queues
    }

    /// The queue registered as `name` (under any VM id).
    pub fn shared_queue(&self, name: &str) -> Option<&SharedQueue> {
        self.shared_queues().iter().find(|q| q.name == name)
    }

    /// `proxy_on_queue_ready` notifications posted and not yet delivered.
    pub fn posted_notifications(&self) -> usize {
        self.state().queues.posted.len()
    }

    /// Delivers every posted `proxy_on_queue_ready`, oldest first, including those the
    /// notified callbacks post. A failed VM gets none (Envoy finds no live context).
    pub(crate) fn deliver_posted(&mut self) -> Result<(), HarnessError> {
        let mut delivered = 0;
        loop {
            if self.vm_failed() {
                self.state_mut().queues.posted.clear();
                return Ok(());
            }
            if delivered == MAX_POSTED_PER_EVENT && !self.state().queues.posted.is_empty() {
                return Err(HarnessError::Usage(format!(
                    "{MAX_POSTED_PER_EVENT} proxy_on_queue_ready in one event: the guest \
                     enqueues again in every one"
                )));
            }
            let Some((root, token)) = self.state_mut().queues.posted.pop_front() else {
                return Ok(());
            };
            delivered += 1;
            let params = (root as i32, token as i32);
            let ran = self.call_guest::<(i32, i32), ()>("proxy_on_queue_ready", root, params)?;
            if ran.is_some() {
                if let Some(queue) = self.state_mut().queues.get_mut(token) {
                    queue.ready_delivered += 1;
                }
            }
        }
    }

    pub(crate) fn vm_failed(&self) -> bool {
        self.failed.is_some()
    }

    /// One guest callback, metered; nothing posted is delivered here.
    pub(crate) fn call_guest<P: WasmParams, R: WasmResults>(
        &mut self,
        name: &'static str,
        context_id: u32,
        params: P,
    ) -> Result<Option<R>, HarnessError> {
        if let Some(reason) = &self.failed {
            return Err(HarnessError::VmFailed(reason.clone()));
        }
        if self.instance.get_export(&mut self.store, name).is_none() {
            return Ok(None);
        }
        let func = self
            .instance
            .get_typed_func::<P, R>(&mut self.store, name)
            .map_err(|e| HarnessError::Load(format!("export {name}: {e:#}")))?;
        self.store.data_mut().effective = context_id;
        let fuel = self.store.data().fuel_per_call;
        let _ = self.store.set_fuel(fuel);
        let result = func.call(&mut self.store, params);
        let left = self.store.get_fuel().unwrap_or(0);
        self.store.data_mut().fuel.push(FuelRecord {
            callback: name,
            context_id,
            fuel: fuel.saturating_sub(left),
        });
        match result {
            Ok(r) => Ok(Some(r)),
            Err(e) => match e.downcast_ref::<ProcExit>() {
                Some(ProcExit(code)) => {
                    self.failed = Some(format!("exited with code {code}"));
                    Err(HarnessError::Exit(*code))
                }
                None => Err(self.trap(name, context_id, &e)),
            },
        }
    }

    fn trap(
        &mut self,
        callback: &'static str,
        context_id: u32,
        e: &wasmtime::Error,
    ) -> HarnessError {
        let message = format!("{e:?}");
        let state = self.store.data();
        let mut last_logs: Vec<String> = state
            .logs
            .iter()
            .rev()
            .take(TRAP_LOG_LINES)
            .map(|l| format!("{:?} [{}] {}", l.level, l.context_id, l.message))
            .collect();
        last_logs.reverse();
        let stderr = String::from_utf8_lossy(&state.stderr);
        if let Some(tail) = stderr.lines().last() {
            last_logs.push(format!("stderr: {tail}"));
        }
        self.failed = Some(format!("{callback}: {message}"));
        HarnessError::Trap {
            callback,
            context_id,
            message,
            last_logs,
        }
    }

    /// Creates the root context and runs `proxy_on_vm_start`; returns the guest's verdict.
    pub fn start(&mut self, vm_config: &[u8]) -> Result<bool, HarnessError> {
        self.event(|host| {
            let state = host.store.data_mut();
            let root = state.next_context_id;
            state.next_context_id += 1;
            state.root_id = root;
            state.vm_config = vm_config.to_vec();
            host.call::<(i32, i32), ()>("proxy_on_context_create", root, (root as i32, 0))?;
            let size = vm_config.len() as i32;
            let params = (root as i32, size);
            Ok(host.call::<(i32, i32), i32>("proxy_on_vm_start", root, params)? != Some(0))
        })
    }

    /// Runs `proxy_on_configure` with `config`; whether the plugin accepted it.
    pub fn configure(&mut self, config: &[u8]) -> Result<bool, HarnessError> {
        let root = self.root_id()?;
        self.store.data_mut().plugin_config = config.to_vec();
        let size = config.len() as i32;
        Ok(
            self.call::<(i32, i32), i32>("proxy_on_configure", root, (root as i32, size))?
                != Some(0),
        )
    }

    /// `new`, `start` and `configure` in one go, as Envoy loads a plugin.
    pub fn boot(wasm: &Wasm, config: &str) -> Result<(Host, bool), HarnessError> {
        let mut host = Host::new(wasm)?;
        if !host.start(b"")? {
            return Ok((host, false));
        }
        let accepted = host.configure(config.as_bytes())?;
        Ok((host, accepted))
    }

    pub(crate) fn root_id(&self) -> Result<u32, HarnessError> {
        match self.store.data().root_id {
            0 => Err(HarnessError::Usage(
                "no root context: call start() first".into(),
            )),
            id => Ok(id),
        }
    }

    /// Runs `proxy_on_tick` on the root context once.
    pub fn tick(&mut self) -> Result<(), HarnessError> {
        let root = self.root_id()?;
        self.call::<i32, ()>("proxy_on_tick", root, root as i32)?;
        Ok(())
    }

    /// Fuel burnt by every callback since `mark` (an index into the fuel log).
    pub fn fuel_since(&self, mark: usize) -> u64 {
        self.store
            .data()
            .fuel
            .iter()
            .skip(mark)
            .map(|r| r.fuel)
            .sum()
    }

    /// A mark for `fuel_since`.
    pub fn fuel_mark(&self) -> usize {
        self.store.data().fuel.len()
    }

    /// An exported mutable i32 global of the guest (hand-written test guests report with it).
    pub fn global_i32(&mut self, name: &str) -> Option<i32> {
        self.instance
            .get_global(&mut self.store, name)?
            .get(&mut self.store)
            .i32()
    }

    /// A bounds-checked copy of guest memory.
    pub fn read_memory(&self, ptr: u32, len: usize) -> Option<Vec<u8>> {
        let memory = self.store.data().memory?;
        let start = usize::try_from(ptr).ok()?;
        memory
            .data(&self.store)
            .get(start..start.checked_add(len)?)
            .map(<[u8]>::to_vec)
    }

    /// Every log line the guest wrote, as text.
    pub fn log_text(&self) -> String {
        let lines: Vec<&str> = self
            .store
            .data()
            .logs
            .iter()
            .map(|l| l.message.as_str())
            .collect();
        lines.join("\n")
    }
}
