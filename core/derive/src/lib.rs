//! `#[derive(Module)]`: a struct's fields become its parameters, buffers
//! and sub-modules, named after the fields, so `named_parameters`,
//! checkpoints and `set_training` need no hand-written code.
//!
//! ```ignore
//! #[derive(Module)]
//! struct Mlp {
//!     fc1: Linear,              // sub-module: keys "fc1.weight", "fc1.bias"
//!     blocks: Vec<Linear>,      // "blocks.0.weight", ...
//!     scale: Param,             // parameter "scale"
//!     #[module(buffer)]
//!     running: Param,           // buffer "running" (checkpointed, not optimised)
//!     #[module(skip)]
//!     width: usize,             // not part of the module's state
//! }
//! impl Mlp {
//!     fn forward<'g>(&self, x: Tensor<'g>) -> Result<Tensor<'g>> { ... }
//! }
//! ```
//!
//! The generated `Module::forward` calls the struct's inherent `forward`
//! (write `#[module(no_forward)]` on the struct for modules that have no
//! single-input forward: calling it is then an `Unsupported` error).
//! A field's type must implement `ModuleField`: `Param`, every kiln layer,
//! any derived module, and `Vec`/`Option`/`Box<dyn Module>` of those.
//! The generated paths start with `::kiln`; inside a crate that depends on
//! `kiln-core` directly, write `#[module(crate = "kiln_core")]`.

use proc_macro::TokenStream;
use quote::quote;
use syn::{parse_macro_input, Data, DeriveInput, Fields, LitStr};

#[derive(Clone, Copy, PartialEq)]
enum Role {
    Field,
    Buffer,
    Skip,
}

#[proc_macro_derive(Module, attributes(module))]
pub fn derive_module(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match expand(input) {
        Ok(tokens) => tokens.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

fn expand(input: DeriveInput) -> syn::Result<proc_macro2::TokenStream> {
    let mut krate: syn::Path = syn::parse_quote!(::kiln);
    let mut has_forward = true;
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("module")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("crate") {
                let s: LitStr = meta.value()?.parse()?;
                krate = s.parse()?;
                Ok(())
            } else if meta.path.is_ident("no_forward") {
                has_forward = false;
                Ok(())
            } else {
                Err(meta.error("expected `crate = \"...\"` or `no_forward`"))
            }
        })?;
    }
    let Data::Struct(data) = &input.data else {
        return Err(syn::Error::new_spanned(&input.ident, "#[derive(Module)] works on structs with named fields"));
    };
    let Fields::Named(fields) = &data.fields else {
        return Err(syn::Error::new_spanned(
            &input.ident,
            "#[derive(Module)] needs named fields (they name the parameters)",
        ));
    };
    let mut params = Vec::new();
    let mut buffers = Vec::new();
    let mut training = Vec::new();
    let mut state_dict = Vec::new();
    for field in &fields.named {
        let mut role = Role::Field;
        for attr in field.attrs.iter().filter(|a| a.path().is_ident("module")) {
            attr.parse_nested_meta(|meta| {
                if meta.path.is_ident("skip") {
                    role = Role::Skip;
                    Ok(())
                } else if meta.path.is_ident("buffer") {
                    role = Role::Buffer;
                    Ok(())
                } else {
                    Err(meta.error("expected `skip` or `buffer`"))
                }
            })?;
        }
        let ident = field.ident.as_ref().expect("named field");
        let name = ident.to_string();
        let name = name.strip_prefix("r#").unwrap_or(&name).to_string();
        match role {
            Role::Skip => {}
            Role::Buffer => {
                buffers.push(quote! {
                    #krate::nn::ModuleField::collect_parameters(&self.#ident, #name, &mut out);
                });
                state_dict.push(quote! {
                    #krate::nn::ModuleField::collect_parameters(&self.#ident, #name, &mut out);
                });
            }
            Role::Field => {
                params.push(quote! {
                    #krate::nn::ModuleField::collect_parameters(&self.#ident, #name, &mut out);
                });
                buffers.push(quote! {
                    #krate::nn::ModuleField::collect_buffers(&self.#ident, #name, &mut out);
                });
                training.push(quote! {
                    #krate::nn::ModuleField::set_training_field(&self.#ident, training);
                });
                state_dict.push(quote! {
                    #krate::nn::ModuleField::collect_state_dict(&self.#ident, #name, &mut out);
                });
            }
        }
    }
    let ident = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    let forward = if has_forward {
        quote! { Self::forward(self, x) }
    } else {
        let msg = format!("{ident} has no single-input forward (#[module(no_forward)])");
        quote! { let _ = x; Err(#krate::Error::unsupported("Module::forward", #msg)) }
    };
    Ok(quote! {
        impl #impl_generics #krate::nn::Module for #ident #ty_generics #where_clause {
            #[track_caller]
            fn forward<'g>(&self, x: #krate::Tensor<'g>) -> #krate::Result<#krate::Tensor<'g>> {
                #forward
            }
            fn parameters(&self) -> ::std::vec::Vec<#krate::Param> {
                #krate::nn::Module::named_parameters(self).into_iter().map(|(_, p)| p).collect()
            }
            /// Field names as keys; a parameter shared by two fields (weight
            /// tying) is listed once, under its first name, as in PyTorch.
            fn named_parameters(&self) -> ::std::vec::Vec<(::std::string::String, #krate::Param)> {
                let mut out = ::std::vec::Vec::new();
                #(#params)*
                #krate::nn::dedup_params(out)
            }
            fn named_buffers(&self) -> ::std::vec::Vec<(::std::string::String, #krate::Param)> {
                let mut out = ::std::vec::Vec::new();
                #(#buffers)*
                #krate::nn::dedup_params(out)
            }
            fn buffers(&self) -> ::std::vec::Vec<#krate::Param> {
                #krate::nn::Module::named_buffers(self).into_iter().map(|(_, p)| p).collect()
            }
            fn set_training(&self, training: bool) {
                #(#training)*
            }
            /// Every field's keys, a tied parameter under each of its names
            /// (PyTorch's state_dict keys), in field order.
            fn state_dict_entries(&self) -> ::std::vec::Vec<(::std::string::String, #krate::Param)> {
                let mut out = ::std::vec::Vec::new();
                #(#state_dict)*
                out
            }
        }
        impl #impl_generics #krate::nn::ModuleField for #ident #ty_generics #where_clause {
            fn collect_parameters(&self, prefix: &str, out: &mut ::std::vec::Vec<(::std::string::String, #krate::Param)>) {
                #krate::nn::prefix_entries(prefix, #krate::nn::Module::named_parameters(self), out);
            }
            fn collect_buffers(&self, prefix: &str, out: &mut ::std::vec::Vec<(::std::string::String, #krate::Param)>) {
                #krate::nn::prefix_entries(prefix, #krate::nn::Module::named_buffers(self), out);
            }
            fn set_training_field(&self, training: bool) {
                #krate::nn::Module::set_training(self, training);
            }
            fn collect_state_dict(&self, prefix: &str, out: &mut ::std::vec::Vec<(::std::string::String, #krate::Param)>) {
                #krate::nn::prefix_entries(prefix, #krate::nn::Module::state_dict_entries(self), out);
            }
        }
    })
}
