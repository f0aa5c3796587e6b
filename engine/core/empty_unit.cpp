// Translation unit for a component library that has no sources of its own yet.
