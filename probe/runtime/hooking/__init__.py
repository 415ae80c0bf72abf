"""The hooking machinery: the start-up stub and its chain, reversible patching, the shape of
an integration and the release checks. It knows no backend."""
