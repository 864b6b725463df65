// A shared library that loads fine but exports no tpcPassPluginInfo: `tpc opt --pass-plugin` must refuse it.
extern "C" int tpcNotAPlugin() { return 42; }
