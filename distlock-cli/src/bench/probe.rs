//! What the hold workload reads about this process from `/proc` (Linux):
//! resident memory, open descriptors, and established TCP connections; and
//! from glibc's allocator, the bytes its live allocations hold.

use std::collections::HashSet;

/// The process's memory at one moment, as the hold workload compares it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Memory {
    /// Resident set size, after the allocator gave back the free pages it
    /// kept (see [`memory`]).
    pub(crate) resident: Option<u64>,
    /// Bytes in live allocations (see [`heap_bytes`]).
    pub(crate) heap: Option<u64>,
}

/// The process's memory now. First asks glibc to return the free pages it
/// keeps (`malloc_trim(0)`, which also releases free pages inside the heap,
/// not only at its top: malloc_trim(3)), so the resident size is what the
/// live allocations occupy, not what freed ones left behind (the acquiring
/// clients' own vectors, an earlier run's buffers).
pub(crate) fn memory() -> Memory {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own arenas, under their locks.
    unsafe {
        libc::malloc_trim(0);
    }
    Memory {
        resident: resident_bytes(),
        heap: heap_bytes(),
    }
}

/// Bytes glibc's allocator has handed out and not had back: `mallinfo2`'s
/// in-use bytes of every arena (`uordblks`) plus its mmapped blocks
/// (`hblkhd`) (mallinfo(3)). Unlike the resident size it counts no page
/// the allocator keeps free, nor the program text and stacks. `None`
/// without glibc.
pub(crate) fn heap_bytes() -> Option<u64> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 has no preconditions; it only reads the arenas'
        // statistics, under their locks.
        let info = unsafe { libc::mallinfo2() };
        let bytes = info.uordblks.checked_add(info.hblkhd)?;
        u64::try_from(bytes).ok()
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}

/// Resident set size in bytes: the second field of `/proc/self/statm`
/// (pages), times the page size (proc(5)).
pub(crate) fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions; it returns -1 for an unknown name.
    let page_size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages.checked_mul(u64::try_from(page_size).ok()?)
}

/// Descriptors this process has open.
pub(crate) fn open_descriptors() -> Option<usize> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count())
}

/// Established TCP connections of this process: the sockets among its
/// descriptors (`socket:[INODE]` links in `/proc/self/fd`) that
/// `/proc/self/net/tcp` and `tcp6` list in state `01` (ESTABLISHED). For a
/// backend reached directly, not through a proxy, it is the number of server
/// connections this client uses.
pub(crate) fn tcp_connections() -> Option<usize> {
    let own: HashSet<u64> = std::fs::read_dir("/proc/self/fd")
        .ok()?
        .filter_map(|entry| {
            let target = std::fs::read_link(entry.ok()?.path()).ok()?;
            let target = target.to_str()?;
            target
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect();
    let mut established = 0;
    for table in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        // Columns: sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode.
        established += text
            .lines()
            .skip(1)
            .filter(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                fields.get(3) == Some(&"01")
                    && fields
                        .get(9)
                        .and_then(|inode| inode.parse::<u64>().ok())
                        .is_some_and(|inode| own.contains(&inode))
            })
            .count();
    }
    Some(established)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_visible() {
        assert!(resident_bytes().is_some_and(|bytes| bytes > 0));
        assert!(open_descriptors().is_some_and(|fds| fds >= 3));
    }

    #[test]
    fn an_established_connection_is_counted() {
        let before = tcp_connections().expect("/proc/self/net/tcp");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let client =
            std::net::TcpStream::connect(listener.local_addr().expect("address")).expect("connect");
        let (server, _) = listener.accept().expect("accept");
        // Both ends are this process's.
        assert_eq!(tcp_connections(), Some(before + 2));
        drop((client, server));
    }
}
