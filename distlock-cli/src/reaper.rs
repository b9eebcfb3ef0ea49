//! One reaper for the whole process: a single SIGCHLD-driven `waitpid(-1)`
//! loop that hands each child's status to whoever registered its pid.
//!
//! distlock is a child subreaper ([`crate::process_group::become_subreaper`]),
//! so orphans of every command it runs become its children, and
//! `waitpid(-1)` is the only way to reap them. With one command
//! (`distlock run`) one loop could keep every status to itself; with several
//! running at once (`distlock cron`), a loop per command would reap, and
//! lose, another command's leader. So one loop reaps everything and
//! dispatches by pid: a leader's or a watchdog's status goes to its
//! supervisor; an orphan's is dropped (its group's supervisor only needs
//! to learn that the group emptied, which it checks with `kill(-pgid, 0)`).

use std::collections::HashMap;
use std::io;
use std::process::ExitStatus;
use std::sync::{Mutex, OnceLock, PoisonError};

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, Notify};

/// The registered children, and a wake-up for every supervisor whenever
/// any child was reaped (a group may have emptied).
struct Registry {
    children: Mutex<HashMap<u32, mpsc::UnboundedSender<ExitStatus>>>,
    reaped: Notify,
}

static REGISTRY: OnceLock<Registry> = OnceLock::new();

fn registry() -> &'static Registry {
    REGISTRY.get_or_init(|| Registry {
        children: Mutex::new(HashMap::new()),
        reaped: Notify::new(),
    })
}

/// Starts the reaper on the current runtime, once per process. The SIGCHLD
/// handler is installed before this returns, so a child spawned afterwards
/// cannot exit unnoticed.
pub(crate) fn start() -> io::Result<()> {
    static STARTED: OnceLock<()> = OnceLock::new();
    if STARTED.get().is_some() {
        return Ok(());
    }
    let mut child_exited = signal(SignalKind::child())?;
    let _ = STARTED.set(());
    tokio::spawn(async move {
        loop {
            reap_all();
            if child_exited.recv().await.is_none() {
                return;
            }
        }
    });
    Ok(())
}

/// Reaps every child that changed state and dispatches the statuses.
fn reap_all() {
    let registry = registry();
    let mut reaped_any = false;
    {
        let mut children = registry
            .children
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for (pid, status) in crate::process_group::reap() {
            reaped_any = true;
            use std::os::unix::process::ExitStatusExt;
            let stopped = status.stopped_signal().is_some();
            let listener = if stopped {
                children.get(&pid).cloned()
            } else {
                children.remove(&pid)
            };
            if let Some(listener) = listener {
                let _ = listener.send(status);
            }
        }
    }
    if reaped_any {
        registry.reaped.notify_waiters();
    }
}

/// A registered child: its statuses (stops, then its exit) arrive here.
pub(crate) struct Child {
    pid: u32,
    statuses: mpsc::UnboundedReceiver<ExitStatus>,
}

impl Child {
    /// The child's pid.
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// A status the reaper has delivered, if any (stops included).
    pub(crate) fn try_status(&mut self) -> Option<ExitStatus> {
        self.statuses.try_recv().ok()
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        registry()
            .children
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.pid);
    }
}

/// Runs `spawn` (which starts a child and returns its pid) and registers
/// the pid, with the reaper held off in between, so the child's exit cannot
/// be reaped before anyone listens for it.
pub(crate) fn spawn_registered<T>(
    spawn: impl FnOnce() -> io::Result<(u32, T)>,
) -> io::Result<(Child, T)> {
    let mut children = registry()
        .children
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let (pid, extra) = spawn()?;
    let (send, statuses) = mpsc::unbounded_channel();
    children.insert(pid, send);
    Ok((Child { pid, statuses }, extra))
}

/// Resolves after the reaper next reaped any child (a group may have
/// emptied). Create it before checking, as with any [`Notify`].
pub(crate) fn any_reaped() -> tokio::sync::futures::Notified<'static> {
    registry().reaped.notified()
}
