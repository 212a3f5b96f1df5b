"""Curated Debian packages that ship (large) pt_BR gettext catalogs.

The list was assembled by hand (desktop suites, toolchains, games, graphics
and office applications); the build downloads them all, counts translated
messages and keeps the ``--max-catalogs`` largest.  Names missing from the
configured archive are skipped with a warning.  Packages that turned out to
ship no pt_BR gettext catalog (their translations are .qm files, in other
packages, or absent) were removed after a first survey.
"""

from __future__ import annotations

PACKAGES: tuple[str, ...] = tuple("""
gcc-12-locales blender-data inkscape gimp-data cataclysm-dda-data freeciv-data
postgresql-15 gnucash-common vlc-l10n wesnoth-1.16-data widelands-data
warzone2100-data minetest-data kodi-data binutils-common libc-l10n coreutils
findutils grep sed tar diffutils gawk make wget bison flex m4 texinfo gettext
man-db procps psmisc sudo kbd xkb-data iso-codes util-linux-locales dpkg apt
aptitude-common debconf-i18n tasksel-data grub-common systemd mercurial-common
libgtk-3-common libgtk2.0-common libgtk-4-common libglib2.0-data
gsettings-desktop-schemas libgweather-4-common evolution-data-server-common
evolution-common gnome-desktop3-data gnome-control-center-data
gnome-shell-common mutter-common nautilus-data gnome-software-common
network-manager network-manager-gnome libnma-common gnome-disk-utility
gnome-system-monitor file-roller gedit-common gnome-terminal-data totem-common
rhythmbox-data cheese-common eog evince-common gnome-calculator gnome-calendar
gnome-contacts gnome-maps gnome-weather gnome-clocks gnome-music gnome-photos
gnome-boxes gnome-builder epiphany-browser-data geary simple-scan seahorse
baobab yelp orca gnome-tweaks gdm3 gnome-initial-setup aisleriot
gnome-online-accounts gnome-settings-daemon-common gnome-session-common
libgoffice-0.10-10-common gnumeric-common anjuta-common gnome-text-editor
tracker cinnamon-l10n mate-applets-common caja-common
mate-control-center-common mate-panel-common pluma-common atril-common
engrampa-common mate-desktop-common mate-power-manager-common
mate-settings-daemon-common mate-utils-common eom-common marco-common
mate-terminal-common mate-system-monitor-common xfce4-session xfce4-panel
thunar-data xfce4-settings xfwm4 xfdesktop4-data xfce4-power-manager-data
mousepad ristretto xfce4-terminal parole libxfce4ui-common libxfce4util-common
digikam-data kdenlive-data kstars-data marble-data okular plasma-desktop-data
dolphin konsole kate5-data k3b-i18n skrooge-common kio-extras-data darktable
gthumb-data shotwell-common hugin-data mypaint-data xournalpp synfigstudio
dia-common audacity-data audacious audacious-plugins-data picard easytag
sound-juicer pavucontrol pulseaudio remmina-common hexchat-common pidgin-data
pan gftp-common filezilla-common claws-mail-i18n sylpheed-i18n liferea-data
mc-data nano vim-runtime lynx-common mutt neomutt gramps grisbi-common
homebank-data osmo git-cola meld gitg zim gnote ghex gucharmap dconf-editor
synaptic system-config-printer-common packagekit lxpanel-data pcmanfm
lxsession-data diffuse
""".split())
