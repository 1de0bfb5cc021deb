"""Framework-neutral parts of horovodlite: runtime lifecycle, process sets, exceptions."""
