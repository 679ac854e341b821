"""Rich views of the engine's step events and results: the live step table, the request timeline,
generations and verification tables, a progress bar, and SVG export. Only Rich and core types here."""
