# Sourced by the scripts that mount a file system on `netdam nbd` (nbdfuse -> loop -> mount)
# under "$work": their cleanup takes the stack down in order and never deletes through a mount.
# Uses $work (the scratch directory) and $loop (the loop device, or empty).

# Unmounts "$work/mnt" (retrying while busy, then detaching it lazily), detaches the loop
# device, and unmounts the nbdfuse mount at "$work/fuse".
release_nbd_stack() {
  if mountpoint -q "$work/mnt"; then
    for _ in 1 2 3 4 5; do umount "$work/mnt" 2>/dev/null && break; sleep 1; done
    # Still busy: detach it now; the kernel finishes when the last user lets go.
    mountpoint -q "$work/mnt" && umount -l "$work/mnt"
  fi
  [ -n "$loop" ] && losetup -d "$loop" 2>/dev/null
  mountpoint -q "$work/fuse" && (fusermount3 -u "$work/fuse" 2>/dev/null || umount -l "$work/fuse")
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
