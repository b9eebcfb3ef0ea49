//! The lock directory, opened once and checked, then used only through its
//! descriptor.
//!
//! Checking a path and then opening it again by name is a race: whoever can
//! replace a directory on the way (or a symbolic link in it) between the
//! check and a later open sends the later open elsewhere, so two processes
//! can lock two different files for one key. The locker therefore resolves
//! its directory itself, one component at a time with `O_NOFOLLOW`, checking
//! every directory and symbolic link it passes from `/` down; keeps the
//! descriptor of the directory it reached for its whole life; and makes
//! every later open, `stat` and `unlink` relative to it (`openat(2)` and
//! friends, `O_NOFOLLOW` on the file's name). Whatever happens to the path
//! afterwards, the locker keeps using the directory it checked.
//!
//! # The rule
//!
//! The rule of OpenSSH's `StrictModes` (`safe_path` in `auth.c`: every
//! component owned by root or the user, none writable by group or others),
//! with the sticky-directory exception of the kernel's
//! `fs.protected_symlinks` and of systemd's `chase` (`CHASE_SAFE`):
//!
//! - every directory from `/` to the lock directory, and every symbolic
//!   link followed on the way, belongs to root or to this user (the
//!   effective uid);
//! - no directory on the way is writable by its group or by others, except
//!   one with the sticky bit (`/tmp`, `/var/tmp`): there only an entry's
//!   owner (or the directory's, or root) can rename or delete the entry, and
//!   the entry on our way belongs to us or root by the first rule;
//! - the lock directory itself is not writable by its group or others, even
//!   with the sticky bit: anyone who can create entries in it could create a
//!   lock file of their own for a key and later replace it.
//!
//! Missing directories are created (mode 0700) during the walk, inside
//! directories already checked.

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};

use super::BACKEND;
use crate::{Error, Result};

/// Symbolic links followed at most while resolving the directory, as the
/// kernel's own limit (`path_resolution(7)`: 40 on Linux).
const MAX_SYMLINKS: usize = 40;

/// An open, checked lock directory and the path it was opened by (for
/// messages only: nothing is ever opened by that path again).
#[derive(Debug)]
pub(super) struct LockDir {
    fd: OwnedFd,
    path: PathBuf,
}

impl LockDir {
    /// Resolves `path` (relative to the working directory if relative),
    /// creating missing directories, and checks it by [the rule](self).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] (`what = "lock directory"`) for a directory
    /// or symbolic link the rule refuses, naming it and what to do;
    /// [`Error::Backend`] if a component cannot be created, read or opened.
    pub(super) fn open(path: &Path) -> Result<Self> {
        let io_error = |e: io::Error, at: &Path| {
            Error::backend(BACKEND, "open the lock directory", super::with_path(e, at))
        };
        let absolute = if path.is_absolute() {
            path.to_path_buf()
        } else {
            let cwd = std::env::current_dir().map_err(|e| io_error(e, Path::new(".")))?;
            cwd.join(path)
        };
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        let root = Path::new("/");
        let root_fd = open_dir(rustix::fs::CWD, OsStr::new("/")).map_err(|e| io_error(e, root))?;
        check_dir(
            &fstat(&root_fd).map_err(|e| io_error(e, root))?,
            root,
            me,
            false,
        )?;
        // The directory reached so far, and the ones it is in from `/`: each
        // the real parent of the next, so `..` is the last one, as for the
        // kernel.
        let mut current = (root_fd, root.to_path_buf());
        let mut ancestors: Vec<(OwnedFd, PathBuf)> = Vec::new();
        let mut pending: VecDeque<OsString> = components(&absolute);
        let mut links = 0;
        while let Some(name) = pending.pop_front() {
            if name == ".." {
                // `/..` is `/`.
                if let Some(parent) = ancestors.pop() {
                    current = parent;
                }
                continue;
            }
            let (parent, parent_path) = (&current.0, &current.1);
            let here = parent_path.join(&name);
            let entry = match stat_entry(parent, &name) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    match rustix::fs::mkdirat(parent, name.as_os_str(), Mode::from_raw_mode(0o700))
                    {
                        Ok(()) => {}
                        // Created meanwhile by someone else: checked below.
                        Err(rustix::io::Errno::EXIST) => {}
                        Err(e) => return Err(io_error(e.into(), &here)),
                    }
                    stat_entry(parent, &name)
                }
                other => other,
            }
            .map_err(|e| io_error(e, &here))?;
            if FileType::from_raw_mode(entry.st_mode) == FileType::Symlink {
                check_owner(&entry, &here, me, "symbolic link")?;
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(io_error(io::Error::from_raw_os_error(libc::ELOOP), &here));
                }
                let target = rustix::fs::readlinkat(parent, name.as_os_str(), Vec::new())
                    .map_err(|e| io_error(e.into(), &here))?;
                let target = Path::new(OsStr::from_bytes(target.as_bytes()));
                if target.is_absolute() {
                    // Back to `/`, the first of the ancestors (if any).
                    if let Some(root) = ancestors.drain(..).next() {
                        current = root;
                    }
                }
                for component in components(target).into_iter().rev() {
                    pending.push_front(component);
                }
                continue;
            }
            if FileType::from_raw_mode(entry.st_mode) != FileType::Directory {
                return Err(io_error(io::Error::from_raw_os_error(libc::ENOTDIR), &here));
            }
            // `O_NOFOLLOW`: if the entry became a symbolic link since it was
            // looked at, this fails instead of following it.
            let fd = open_dir(parent, &name).map_err(|e| {
                let e = if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) {
                    io::Error::new(
                        e.kind(),
                        "replaced by something else than a directory while being opened; try again, \
                         and find out who changes it",
                    )
                } else {
                    e
                };
                io_error(e, &here)
            })?;
            // The directory opened, not the entry looked at before.
            let opened = fstat(&fd).map_err(|e| io_error(e, &here))?;
            check_dir(&opened, &here, me, false)?;
            ancestors.push(std::mem::replace(&mut current, (fd, here)));
        }
        let (fd, real) = current;
        check_dir(
            &fstat(&fd).map_err(|e| io_error(e, &real))?,
            &real,
            me,
            true,
        )?;
        Ok(LockDir {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// The path the directory was opened by.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// The path of `name` in the directory, for messages.
    pub(super) fn path_of(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Opens (creating if missing) the file `name` in the directory for
    /// reading and writing, or only for reading if not `create`; refuses to
    /// follow a symlink planted in its place (`O_NOFOLLOW`) or to use anything
    /// but a regular file. `O_CLOEXEC`: a child process never inherits the
    /// lock.
    pub(super) fn open_file(&self, name: &str, create: bool) -> io::Result<File> {
        let access = if create {
            OFlags::RDWR | OFlags::CREATE
        } else {
            OFlags::RDONLY
        };
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            access | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            // As std's `File::create`: the umask decides.
            Mode::from_raw_mode(0o666),
        )
        .map_err(|e| {
            if e == rustix::io::Errno::LOOP {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "the lock file is a symbolic link; refusing to follow it (remove it if you did not put it there)",
                )
            } else {
                e.into()
            }
        })?;
        let file = File::from(fd);
        if !file.metadata()?.file_type().is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the lock file is not a regular file",
            ));
        }
        Ok(file)
    }

    /// The device and inode of the entry `name` (not following a symlink).
    pub(super) fn file_id(&self, name: &str) -> io::Result<(u64, u64)> {
        let stat = stat_entry(&self.fd, OsStr::new(name))?;
        Ok((stat.st_dev, stat.st_ino))
    }

    /// Removes the entry `name`.
    pub(super) fn remove(&self, name: &str) -> io::Result<()> {
        Ok(rustix::fs::unlinkat(&self.fd, name, AtFlags::empty())?)
    }

    /// The names of the directory's entries (not `.` and `..`).
    pub(super) fn names(&self) -> io::Result<Vec<OsString>> {
        let mut names = Vec::new();
        // Opened for reading here: the kept descriptor may be `O_PATH`.
        let readable = rustix::fs::openat(
            &self.fd,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        for entry in rustix::fs::Dir::new(readable)? {
            let name = entry?.file_name().to_bytes().to_vec();
            if name != b"." && name != b".." {
                names.push(OsString::from_vec(name));
            }
        }
        Ok(names)
    }
}

/// The names in `path`, in order; `/` and `.` dropped (`..` kept).
fn components(path: &Path) -> VecDeque<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}

/// How directories are opened: `O_PATH` where there is one, which needs no
/// read permission, so a directory on the way that may only be searched
/// (mode 0711, as some systems give `/home`) is passed as the kernel's own
/// lookup passes it; every `*at` call takes such a descriptor. Elsewhere the
/// directories on the way must be readable.
#[cfg(any(target_os = "linux", target_os = "android"))]
const DIR_ACCESS: OFlags = OFlags::PATH;
#[cfg(not(any(target_os = "linux", target_os = "android")))]
const DIR_ACCESS: OFlags = OFlags::RDONLY;

fn open_dir(parent: impl AsFd, name: &OsStr) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        parent,
        name,
        DIR_ACCESS | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

fn stat_entry(parent: impl AsFd, name: &OsStr) -> io::Result<Stat> {
    Ok(rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW)?)
}

fn fstat(fd: impl AsFd) -> io::Result<Stat> {
    Ok(rustix::fs::fstat(fd)?)
}

fn refused(reason: String) -> Error {
    Error::invalid(
        "lock directory",
        format!(
            "{reason}: another local user could replace lock files or plant symlinks there and take \
             locks from their holders"
        ),
    )
}

fn check_owner(stat: &Stat, path: &Path, me: libc::uid_t, what: &str) -> Result<()> {
    if stat.st_uid == me || stat.st_uid == 0 {
        return Ok(());
    }
    Err(refused(format!(
        "the {what} {} belongs to uid {}, not to this user (uid {me}) or root; use a directory \
         whose every component is yours or root's (for example under your home), or have its \
         owner give it to you",
        path.display(),
        stat.st_uid
    )))
}

/// Applies [the rule](self) to a directory on the way (`lock_dir` false) or
/// to the lock directory itself.
fn check_dir(stat: &Stat, path: &Path, me: libc::uid_t, lock_dir: bool) -> Result<()> {
    check_owner(stat, path, me, "directory")?;
    let mode = stat.st_mode & 0o7777;
    let sticky = mode & 0o1000 != 0;
    let writable_by = match (mode & 0o020 != 0, mode & 0o002 != 0) {
        (_, true) => "every user",
        (true, false) => "its group",
        (false, false) => return Ok(()),
    };
    if sticky && !lock_dir {
        return Ok(());
    }
    let fix = if lock_dir {
        format!("remove that permission (chmod go-w {})", path.display())
    } else {
        format!(
            "remove that permission (chmod go-w {0}), or set its sticky bit as /tmp has (chmod +t {0})",
            path.display()
        )
    };
    Err(refused(format!(
        "{} is writable by {writable_by} (mode {mode:o}){}; {fix}, or use another directory",
        path.display(),
        if sticky || lock_dir {
            ""
        } else {
            " without the sticky bit"
        }
    )))
}
