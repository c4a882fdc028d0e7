#!/usr/bin/env bash
# mmdebstrap customize hook for the lab's shared base root filesystem. $1 is the root directory.
# Everything host-specific (hostname, keys, doubles, units) is added per host by lab/lab at `up`.
set -euo pipefail
root=$1

# Each host gets its own host key at `up`; the base must not carry shared ones.
rm -f "$root"/etc/ssh/ssh_host_*
cat > "$root/etc/ssh/sshd_config.d/pivot-lab.conf" <<'CONF'
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
CONF

# A container has no consoles, no hardware clock and no need for periodic jobs.
for unit in getty.target console-getty.service systemd-timesyncd.service apt-daily.timer \
            apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer fstrim.timer; do
  ln -sf /dev/null "$root/etc/systemd/system/$unit"
done
# sshd comes up at boot; socket activation is off in Debian 12's default, keep it that way.
ln -sf /lib/systemd/system/ssh.service "$root/etc/systemd/system/multi-user.target.wants/ssh.service"
echo 'root:*' | chroot "$root" chpasswd -e
