#!/bin/bash
# sge_install.sh (testinfra.md §5): gridengine needs debconf answers before apt installs it
H=$(hostname)
debconf-set-selections <<SEL
gridengine-common gridengine/sgeroot string /var/lib/gridengine
gridengine-common gridengine/sgecell string default
gridengine-common gridengine/adminuser string sgeadmin
gridengine-common gridengine/configure boolean true
gridengine-master gridengine/sgemaster string $H
gridengine-common gridengine/sgemaster string $H
gridengine-client gridengine/sgemaster string $H
gridengine-master gridengine/adminmail string root@localhost
gridengine-common gridengine/adminmail string root@localhost
SEL
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends gridengine-master gridengine-exec gridengine-client
