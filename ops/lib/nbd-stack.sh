# shellcheck shell=bash disable=SC2154  # $work and $loop belong to the script that sources this
# Sourced by the scripts that mount a file system on `netdam nbd` (nbdfuse -> loop -> mount)
# under "$work": their cleanup takes the stack down in order and never deletes through a mount.
# Uses $work (the scratch directory) and $loop (the loop device, or empty).

# True when something is mounted at exactly $1. Read from /proc/mounts rather than asked of the
# path (`mountpoint`): a FUSE mount whose daemon died answers every stat with ENOTCONN, so
# `mountpoint` calls it not mounted, and it would stay behind.
is_mounted() {
  awk -v path="$1" '$2 == path { found = 1 } END { exit !found }' /proc/mounts
}

# Unmounts "$work/mnt" (retrying while busy, then detaching it lazily), detaches the loop
# device (and any other backed by the nbdfuse file: one attached just before an interrupt may
# not be in $loop yet), and unmounts the nbdfuse mount at "$work/fuse", dead or alive.
release_nbd_stack() {
  local device
  if is_mounted "$work/mnt"; then
    # Busy for a moment after a stopped writer (a dd ends once its fsync returns): retry for 5 s.
    for _ in $(seq 25); do umount "$work/mnt" 2>/dev/null && break; sleep 0.2; done
    # Still busy: detach it now; the kernel finishes when the last user lets go.
    is_mounted "$work/mnt" && umount -l "$work/mnt"
  fi
  # losetup reads the backing file's name from sysfs, without touching a dead FUSE file.
  for device in $loop $(losetup -n -l -O NAME,BACK-FILE 2>/dev/null \
    | awk -v file="$work/fuse/disk" '$2 == file { print $1 }'); do
    losetup -d "$device" 2>/dev/null || true
  done
  if is_mounted "$work/fuse"; then
    fusermount3 -u "$work/fuse" 2>/dev/null || umount -l "$work/fuse"
  fi
  return 0
}

# Removes "$work", unless something is still mounted under it.
remove_work_dir() {
  if grep -q " $work/" /proc/mounts; then
    echo "left $work in place: something is still mounted under it" >&2
  else
    rm -rf --one-file-system "$work"
  fi
}
